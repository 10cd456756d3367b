"""NUMA topology as this process sees it: nodes, their CPUs and memory, the distance table, and
what the process may use (its affinity, its cpuset's memory nodes, its memory policy).

One reader of the live system (sysfs, /proc/self/status, get_mempolicy) and one of `numactl
--hardware` dumps, so real multi-socket machines replay here as CPU dumps do; both give a
:class:`Topology`, whose JSON is the machine report's ``numa`` section. The kernels
(``MoE(numa=...)``), ``kt doctor`` and ``kt bench`` read it; nothing else parses these files.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ktforge.detect.dumps import parse_cpu_list
from ktforge.detect.report_types import NumaNodeJson, NumaSection

# Two nodes closer than this share a socket (SLIT: 10 local; SNC/NPS siblings 11-12; another
# socket 20-32): the inference of sub-NUMA clustering from the distance table.
SAME_SOCKET_DISTANCE = 16
# get_mempolicy's modes (linux/mempolicy.h)
MEMORY_POLICIES = ("default", "preferred", "bind", "interleave", "local", "preferred-many", "weighted-interleave")
_SYS_GET_MEMPOLICY = 239  # x86-64


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]  # online CPUs of the node
    usable_cpus: tuple[int, ...]  # of those, the ones this process may run on
    memory_bytes: int | None
    distances: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]
    source: str  # "live" or "numactl"
    online_cpus: tuple[int, ...] | None = None
    affinity: tuple[int, ...] | None = None
    memory_nodes: tuple[int, ...] | None = None  # the nodes the process may allocate on (its cpuset)
    memory_policy: str | None = None
    policy_nodes: tuple[int, ...] = ()
    numa_balancing: int | None = None

    def node(self, node_id: int) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def usable_nodes(self) -> tuple[Node, ...]:
        """Nodes with CPUs this process may run on."""
        return tuple(n for n in self.nodes if n.usable_cpus)

    def memory_only_nodes(self) -> tuple[Node, ...]:
        """Nodes with memory and no CPUs (CXL expanders, HBM in flat mode)."""
        return tuple(n for n in self.nodes if not n.cpus and (n.memory_bytes or 0) > 0)

    def sockets(self) -> list[list[int]]:
        """CPU nodes grouped by socket, inferred from the distance table (nodes nearer than
        SAME_SOCKET_DISTANCE share one); each node alone where distances are unknown."""
        cpu_nodes = [n for n in self.nodes if n.cpus]
        groups: list[list[int]] = []
        for node in cpu_nodes:
            near = [g for g in groups if any(node.distances.get(m, 99) < SAME_SOCKET_DISTANCE for m in g)]
            merged = [node.id] + [m for g in near for m in g]
            groups = [g for g in groups if g not in near] + [sorted(merged)]
        return sorted(groups)

    def mode(self) -> str:
        """How the nodes came about, as far as the table tells: one node, one a socket, or
        sub-NUMA clustering (Intel SNC, AMD NPS2/4) splitting sockets."""
        cpu_nodes = sum(1 for n in self.nodes if n.cpus)
        if cpu_nodes <= 1:
            return "one node"
        sockets = self.sockets()
        if len(sockets) == cpu_nodes:
            return f"one node a socket ({cpu_nodes} sockets)"
        return f"sub-NUMA clustering: {cpu_nodes} nodes on {len(sockets)} socket(s) (Intel SNC, AMD NPS)"

    def to_json(self) -> NumaSection:
        detail: dict[str, NumaNodeJson] = {
            str(n.id): {
                "cpus": list(n.cpus),
                "usable_cpus": list(n.usable_cpus),
                "memory_bytes": n.memory_bytes,
                "distances": {str(k): v for k, v in sorted(n.distances.items())},
            }
            for n in self.nodes
        }
        return {
            "nodes": {str(n.id): list(n.cpus) for n in self.nodes},
            "online_cpus": list(self.online_cpus) if self.online_cpus is not None else None,
            "affinity": list(self.affinity) if self.affinity is not None else None,
            "detail": detail,
            "memory_nodes": list(self.memory_nodes) if self.memory_nodes is not None else None,
            "memory_policy": self.memory_policy,
            "policy_nodes": list(self.policy_nodes),
            "numa_balancing": self.numa_balancing,
            "sockets": self.sockets(),
            "mode": self.mode(),
            "source": self.source,
        }


def from_json(section: NumaSection) -> Topology:
    """The report's section back into a Topology (a snapshot replays into the same checks)."""
    detail = section.get("detail") or {}
    nodes = []
    for key, cpus in sorted(section["nodes"].items(), key=lambda item: int(item[0])):
        d = detail.get(key)
        nodes.append(
            Node(
                int(key),
                tuple(cpus),
                tuple(d["usable_cpus"]) if d else tuple(cpus),
                d["memory_bytes"] if d else None,
                {int(k): v for k, v in d["distances"].items()} if d else {},
            )
        )
    affinity, online, mems = section["affinity"], section["online_cpus"], section.get("memory_nodes")
    return Topology(
        tuple(nodes),
        section.get("source") or "live",
        tuple(online) if online is not None else None,
        tuple(affinity) if affinity is not None else None,
        tuple(mems) if mems is not None else None,
        section.get("memory_policy"),
        tuple(section.get("policy_nodes") or ()),
        section.get("numa_balancing"),
    )


# --- the live system -------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _status_list(status: str | None, key: str) -> tuple[int, ...] | None:
    match = re.search(rf"^{key}:\s*(\S*)", status or "", re.MULTILINE)
    return tuple(parse_cpu_list(match.group(1))) if match else None


def memory_policy() -> tuple[str | None, tuple[int, ...]]:
    """This thread's memory policy (get_mempolicy) and its nodes; (None, ()) where the call fails."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mode = ctypes.c_int(0)
        mask = (ctypes.c_ulong * 16)()  # 1024 nodes
        if libc.syscall(_SYS_GET_MEMPOLICY, ctypes.byref(mode), mask, ctypes.c_ulong(1024), None, 0) != 0:
            return None, ()
    except (OSError, AttributeError):
        return None, ()
    flags_mask = (1 << 13) - 1  # MPOL_F_STATIC_NODES and friends ride in the high bits
    index = mode.value & flags_mask
    name = MEMORY_POLICIES[index] if index < len(MEMORY_POLICIES) else f"mode {index}"
    nodes = tuple(i for i in range(1024) if mask[i // 64] >> (i % 64) & 1)
    return name, nodes


def read_live() -> Topology:
    """The topology of this machine as this process sees it."""
    base = Path("/")
    online_text = _read(base / "sys/devices/system/cpu/online")
    online = tuple(parse_cpu_list(online_text.strip())) if online_text else None
    status = _read(base / "proc/self/status")
    affinity = tuple(sorted(os.sched_getaffinity(0)))
    policy, policy_nodes = memory_policy()
    found = []
    for path in sorted(base.glob("sys/devices/system/node/node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = tuple(parse_cpu_list((_read(path / "cpulist") or "").strip()))
        if online is not None:
            cpus = tuple(c for c in cpus if c in online)
        meminfo = re.search(r"MemTotal:\s+(\d+) kB", _read(path / "meminfo") or "")
        row = [int(v) for v in (_read(path / "distance") or "").split()]
        found.append((int(path.name[4:]), cpus, int(meminfo.group(1)) * 1024 if meminfo else None, row))
    ids = [entry[0] for entry in found]  # a distance row is in node order: its i-th entry is the i-th node
    nodes = []
    for n, cpus, memory, row in found:
        usable = tuple(c for c in cpus if affinity is None or c in affinity)
        nodes.append(Node(n, cpus, usable, memory, dict(zip(ids, row, strict=False))))
    balancing = (_read(base / "proc/sys/kernel/numa_balancing") or "").strip()
    return Topology(
        tuple(nodes),
        "live",
        online,
        affinity,
        _status_list(status, "Mems_allowed_list"),
        policy,
        policy_nodes,
        int(balancing) if balancing.isdigit() else None,
    )


# --- numactl --hardware dumps ----------------------------------------------------------------


def parse_numactl(text: str, affinity: list[int] | None = None) -> Topology:
    """A `numactl --hardware` (or `-H --cpu-compress`) dump: nodes, CPUs, sizes, distances. The
    dump says nothing of the process that made it: its CPUs are `affinity` (as `taskset -p` or a
    container's cpuset would narrow them), every CPU where None; it may use every node's memory."""
    cpus: dict[int, tuple[int, ...]] = {}
    sizes: dict[int, int] = {}
    for line in text.splitlines():
        if match := re.match(r"node (\d+) cpus:(.*)$", line.strip()):
            listed = re.sub(r"\(\d+\)", "", match.group(2)).replace(" ", ",").strip(",")
            cpus[int(match.group(1))] = tuple(parse_cpu_list(re.sub(",+", ",", listed))) if listed else ()
        elif match := re.match(r"node (\d+) size: (\d+) MB", line.strip()):
            sizes[int(match.group(1))] = int(match.group(2)) << 20
    if not cpus:
        raise ValueError("not a numactl --hardware dump: no 'node N cpus:' lines")
    table = text.split("node distances:", 1)[1].splitlines() if "node distances:" in text else []
    header = [int(v) for v in table[1].split()[1:]] if len(table) > 1 and table[1].split()[:1] == ["node"] else []
    distances: dict[int, dict[int, int]] = {}
    for line in table[2:]:
        if match := re.match(r"\s*(\d+):\s+([\d\s]+)$", line):
            distances[int(match.group(1))] = dict(zip(header, (int(v) for v in match.group(2).split()), strict=False))
    online = tuple(sorted(c for listed in cpus.values() for c in listed))
    allowed = tuple(sorted(affinity)) if affinity is not None else online
    nodes = tuple(
        Node(n, c, tuple(x for x in c if x in allowed), sizes.get(n), distances.get(n, {}))
        for n, c in sorted(cpus.items())
    )
    return Topology(nodes, "numactl", online, allowed, tuple(n.id for n in nodes if n.memory_bytes))
