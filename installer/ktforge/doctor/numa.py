"""NUMA checks: the nodes and how the kernels split over them, and the settings that undo it
(a memory policy at odds with the CPUs, automatic NUMA balancing, a cpuset that splits a node's
CPUs from its memory, transparent huge pages off). All read the report's numa section
(ktforge.detect.topology), the same that MoE(numa="auto") reads."""

from __future__ import annotations

from ktforge.builder.assessment import Assessment
from ktforge.detect.topology import Topology, from_json
from ktforge.doctor.common import GIB
from ktforge.doctor.findings import Finding, Say, check
from ktforge.remedies import remedy


def _topology(r: Assessment) -> Topology | None:
    numa = r["numa"]
    return from_json(numa) if numa is not None and numa["nodes"] else None


def _fix(say: Say, status: str, text: str, gate: str) -> Finding:
    fix = remedy(gate)
    return say(status, text, fix.text, *fix.commands)  # type: ignore[arg-type]


@check("system.numa", "system", "NUMA nodes, and how the kernels split over them")
def _numa(r: Assessment, say: Say) -> Finding:
    topology = _topology(r)
    if topology is None:
        return say("unknown" if r["numa"] is None else "info", "no NUMA information (sysfs node directory absent)")
    parts = []
    for node in topology.nodes:
        memory = f"{node.memory_bytes / GIB:.0f} GiB" if node.memory_bytes is not None else "memory unknown"
        cpus = f"{len(node.usable_cpus)} of {len(node.cpus)} CPUs usable" if node.cpus else "no CPUs"
        parts.append(f"node {node.id}: {cpus}, {memory}")
    text = "; ".join(parts) + f" ({topology.mode()})"
    only_memory = topology.memory_only_nodes()
    if only_memory:
        ids = ", ".join(str(n.id) for n in only_memory)
        text += f"; node(s) {ids} have memory and no CPUs (CXL, HBM in flat mode): ktforge places no share there"
    usable = topology.usable_nodes()
    if len(usable) > 1:
        ids = ", ".join(str(n.id) for n in usable)
        return say("info", text + f"; MoE(numa='auto') runs one pool a node ({ids}), each node's columns in its memory")
    return say("ok", text + "; one pool, as on any one-node machine")


@check("system.numa_policy", "system", "memory policy against the CPUs' nodes")
def _policy(r: Assessment, say: Say) -> Finding:
    topology = _topology(r)
    if topology is None or topology.memory_policy is None:
        return say("unknown", "the process's memory policy is not in the evidence (a dump, or get_mempolicy failed)")
    policy, nodes = topology.memory_policy, sorted(topology.policy_nodes)
    cpu_nodes = sorted(n.id for n in topology.usable_nodes())
    if policy == "interleave" and len(cpu_nodes) > 1:
        return _fix(
            say,
            "warn",
            f"this process interleaves its memory over nodes {nodes} while its CPUs span nodes {cpu_nodes}: "
            "every allocation but the weights ktforge places is half remote",
            "numa_policy",
        )
    if policy in ("bind", "preferred", "preferred-many") and nodes and not set(cpu_nodes) <= set(nodes):
        return _fix(
            say,
            "warn",
            f"memory is {policy} to node(s) {nodes} while the CPUs are on node(s) {cpu_nodes}: "
            "the threads on the other nodes read it remotely",
            "numa_policy",
        )
    where = f" to node(s) {nodes}" if nodes else ""
    return say("ok", f"memory policy {policy}{where}; CPUs on node(s) {cpu_nodes}")


@check("system.numa_balancing", "system", "automatic NUMA balancing")
def _balancing(r: Assessment, say: Say) -> Finding:
    topology = _topology(r)
    if topology is None or topology.numa_balancing is None:
        return say("unknown", "kernel.numa_balancing is not in the evidence")
    if topology.numa_balancing == 0:
        return say("ok", "automatic NUMA balancing is off")
    if len(topology.nodes) < 2:
        return say("ok", f"kernel.numa_balancing={topology.numa_balancing}, without effect on one node")
    return _fix(
        say, "warn", f"kernel.numa_balancing={topology.numa_balancing} on {len(topology.nodes)} nodes", "numa_balancing"
    )


@check("system.cpuset_memory", "system", "each node's CPUs and memory allowed together")
def _cpuset(r: Assessment, say: Say) -> Finding:
    topology = _topology(r)
    if topology is None or topology.memory_nodes is None:
        return say("unknown", "the process's cpuset (Mems_allowed_list) is not in the evidence")
    mems = set(topology.memory_nodes)
    stranded = [n.id for n in topology.nodes if n.id in mems and n.cpus and not n.usable_cpus]
    cpus_only = [n.id for n in topology.usable_nodes() if n.id not in mems and (n.memory_bytes or 0) > 0]
    if stranded:
        return _fix(
            say,
            "warn",
            f"node(s) {stranded}: memory allowed, none of their CPUs: what lands there is read from other nodes",
            "cpuset_memory",
        )
    if cpus_only:
        return _fix(
            say,
            "warn",
            f"node(s) {cpus_only}: CPUs allowed, not their memory: their shares are read from other nodes",
            "cpuset_memory",
        )
    return say("ok", f"memory nodes {sorted(mems)} allowed with their CPUs")


@check("system.thp", "system", "transparent huge pages for the packed weights")
def _thp(r: Assessment, say: Say) -> Finding:
    memory = r["memory"]
    mode = memory["transparent_hugepages"] if memory else None
    if mode is None:
        return say("unknown", "transparent huge pages: not in the evidence")
    if mode == "never":
        return _fix(say, "warn", "transparent huge pages are off (never)", "transparent_hugepages")
    return say("ok", f"transparent huge pages: {mode} (ktforge advises them for the packed weights)")
