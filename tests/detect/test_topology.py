"""The NUMA topology: real multi-node machines replayed from their `numactl --hardware` dumps
(tests/fixtures/numa), the live reader under a narrowed affinity and a real memory policy, the
shares MoE(numa=...) makes of each, and the doctor's NUMA findings on them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ktforge.builder.assessment import assess
from ktforge.detect import evidence, topology
from ktforge.detect.topology import Topology, parse_numactl
from ktforge.doctor import run_checks
from ktforge.kernels import numa

from ..conftest import CPUINFO_FIXTURES

DUMPS = Path(__file__).parent.parent / "fixtures" / "numa"

# What each dump shows: CPU nodes, memory-only nodes, sockets as the distance table groups the
# CPU nodes, and all CPUs
MACHINES = {
    "epyc-2s-nps4": (8, 0, [[0, 1, 2, 3], [4, 5, 6, 7]], 256),
    "xeon-max-2s-hbm-flat": (2, 2, [[0], [1]], 208),
    "zen5-2s-cxl": (2, 1, [[0], [1]], 384),
    "xeon-8-nodes-10-12-17-19": (8, 0, [[0, 1], [2, 3], [4, 5], [6, 7]], 160),
    "epyc-9375f-2s-nps1": (2, 0, [[0], [1]], 64),
    "epyc-9135-2s-nps1-cpu-compress": (2, 0, [[0], [1]], 32),
    "threadripper-3960x-nps4": (4, 0, [[0, 1, 2, 3]], 48),
    "xeon-c5n-18xlarge-2s": (2, 0, [[0], [1]], 72),
    "xeon-8480-2s-snc4": (8, 0, [[0, 1, 2, 3], [4, 5, 6, 7]], 112),
}


def replay(name: str, affinity: list[int] | None = None) -> Topology:
    return parse_numactl((DUMPS / f"{name}.txt").read_text(), affinity)


def test_every_dump_in_the_folder_is_described() -> None:
    assert sorted(p.stem for p in DUMPS.glob("*.txt")) == sorted(MACHINES)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_a_real_machine_replays(name: str) -> None:
    cpu_nodes, memory_only, sockets, cpus = MACHINES[name]
    topo = replay(name)
    text = (DUMPS / f"{name}.txt").read_text()
    assert len(topo.nodes) == int(text.split("available: ")[1].split()[0])
    assert sum(1 for n in topo.nodes if n.cpus) == cpu_nodes
    assert len(topo.memory_only_nodes()) == memory_only
    assert topo.sockets() == sockets
    assert sum(len(n.cpus) for n in topo.nodes) == cpus == len(set(topo.online_cpus or ()))
    for node in topo.nodes:  # the table is square and 10 on its diagonal
        assert node.distances[node.id] == 10 and set(node.distances) == {n.id for n in topo.nodes}
    assert topology.from_json(json.loads(json.dumps(topo.to_json()))) == topo
    sub_numa = cpu_nodes > len(sockets)
    assert topo.mode().startswith("sub-NUMA") == sub_numa


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_auto_makes_one_share_a_cpu_node_with_its_memory(name: str) -> None:
    topo = replay(name)
    shares = numa.resolve("auto", None, topo)
    assert [s.cpus for s in shares] == [n.cpus for n in topo.nodes if n.cpus]
    for share, node in zip(shares, [n for n in topo.nodes if n.cpus], strict=True):
        assert (share.node == node.id) == bool(node.memory_bytes)  # a CPU-only node: its nearest memory
        assert topo.node(share.node).memory_bytes


def test_sapphire_rapids_snc4_runs_a_pool_a_sub_node() -> None:
    # two Xeon 8480+ with SNC4: 8 nodes of 14 cores, 12 within a socket, 21 across
    topo = replay("xeon-8480-2s-snc4")
    assert topo.mode().startswith("sub-NUMA")
    shares = numa.resolve("auto", None, topo)
    assert [(len(s.cpus), s.node) for s in shares] == [(14, n) for n in range(8)]
    half = numa.resolve("auto", 56, topo)  # 56 threads: 7 a sub-node, each on its own node's CPUs
    assert [len(s.cpus) for s in half] == [7] * 8 and all(set(s.cpus) <= set(topo.node(s.node).cpus) for s in half)


def test_a_cpu_node_without_memory_takes_the_nearest_memory() -> None:
    topo = replay("threadripper-3960x-nps4")  # nodes 0 and 3: CPUs, 0 MB
    assert [s.node for s in numa.resolve("auto", None, topo)] == [1, 1, 2, 1]


def test_threads_are_spread_over_the_shares_in_proportion() -> None:
    topo = replay("epyc-2s-nps4")  # 8 nodes of 32 CPUs
    shares = numa.resolve("auto", 16, topo)
    assert [len(s.cpus) for s in shares] == [2] * 8
    assert all(set(s.cpus) <= set(topo.node(s.node).cpus) for s in shares)
    with pytest.raises(ValueError, match=r"8 pools .* more than threads=4"):
        numa.resolve("auto", 4, topo)


def test_a_process_limited_to_part_of_one_node_runs_one_pool() -> None:
    # `taskset -c 0-7` or a container's cpuset on a 2-socket Turin: every usable CPU on node 0
    topo = replay("epyc-9375f-2s-nps1", affinity=list(range(8)))
    assert [n.usable_cpus for n in topo.usable_nodes()] == [tuple(range(8))]
    assert numa.resolve("auto", None, topo) == []
    assert numa.resolve([0], None, topo) == [numa.NumaShare(range(8), 0)]
    with pytest.raises(ValueError, match="NUMA node 1 has no CPU this process may run on"):
        numa.resolve([1], None, topo)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([9], "NUMA node 9 does not exist"),
        ([2], "memory only"),  # the HBM of socket 0
        ([0, 0], "lists a node twice"),
        ([], "lists no node"),
        ("interleave", "must be 'auto', 'off'"),
        ([numa.NumaShare([0, 1], 0), numa.NumaShare([1, 2], 1)], "overlap on CPUs \\[1\\]"),
        ([numa.NumaShare([0], 7)], "NUMA node 7 does not exist"),
        ([numa.NumaShare([999], 0)], "not CPUs this process may run on"),
        ([numa.NumaShare([], 0)], "at least one CPU"),
        ([0, numa.NumaShare([1], 0)], "not both"),
    ],
)
def test_bad_numa_arguments_are_refused_by_name(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        numa.resolve(spec, None, replay("xeon-max-2s-hbm-flat"))


def _child(code: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_the_live_reader_sees_this_processs_affinity_and_policy() -> None:
    # a process narrowed to one CPU (as `taskset -c 0` does), its memory preferred on node 0
    # (as `numactl --preferred=0` does: set_mempolicy(MPOL_PREFERRED))
    found = _child(
        """
        import ctypes, json, os
        os.sched_setaffinity(0, {0})
        mask = ctypes.c_ulong(1)
        assert ctypes.CDLL(None).syscall(238, 1, ctypes.byref(mask), ctypes.c_ulong(65)) == 0
        from ktforge.detect import topology
        from ktforge.kernels import numa
        live = topology.read_live()
        print(json.dumps({"topology": live.to_json(), "shares": [list(s.cpus) for s in numa.resolve([0], None)]}))
        """
    )
    live = found["topology"]
    assert live["affinity"] == [0]
    assert live["detail"]["0"]["usable_cpus"] == [0]
    assert (live["memory_policy"], live["policy_nodes"]) == ("preferred", [0])
    assert found["shares"] == [[0]]
    balancing = Path("/proc/sys/kernel/numa_balancing")
    expected = int(balancing.read_text()) if balancing.exists() else None
    assert live["numa_balancing"] == expected
    assert live["memory_nodes"] is not None and 0 in live["memory_nodes"]


def _doctor(topo: Topology) -> dict[str, Any]:
    """kt doctor's findings on a (replayed) machine report whose numa section is `topo`'s."""
    report: Any = assess(evidence.from_file(CPUINFO_FIXTURES / "linux-rocky8.5-zen4"))
    report["numa"] = topo.to_json()
    return {f.id: f for f in run_checks(report)}


def test_the_doctor_names_each_numa_setting_that_undoes_the_split() -> None:
    two_sockets = replay("epyc-9375f-2s-nps1")
    findings = _doctor(dataclasses.replace(two_sockets, memory_policy="interleave", policy_nodes=(0, 1)))
    assert findings["system.numa"].status == "info" and "one pool a node (0, 1)" in findings["system.numa"].finding
    assert findings["system.numa_policy"].status == "warn" and "interleaves" in findings["system.numa_policy"].finding
    assert "numactl" in findings["system.numa_policy"].remedy
    bound = _doctor(dataclasses.replace(two_sockets, memory_policy="bind", policy_nodes=(0,), numa_balancing=1))
    assert bound["system.numa_policy"].status == "warn" and "bind to node(s) [0]" in bound["system.numa_policy"].finding
    assert bound["system.numa_balancing"].status == "warn"
    assert bound["system.numa_balancing"].commands == ("sudo sysctl -w kernel.numa_balancing=0",)
    # a cpuset with node 1's memory and none of its CPUs
    stranded = replay("epyc-9375f-2s-nps1", affinity=list(range(32)))
    assert _doctor(stranded)["system.cpuset_memory"].status == "warn"
    hbm = _doctor(replay("xeon-max-2s-hbm-flat"))["system.numa"]
    assert "node(s) 2, 3 have memory and no CPUs" in hbm.finding
    nps4 = _doctor(replay("epyc-2s-nps4"))["system.numa"]
    assert "sub-NUMA clustering: 8 nodes on 2 socket(s)" in nps4.finding
