"""MoE(numa=...): which NUMA shares a layer runs as, from the machine report's topology.

A share is a set of CPUs (one pool thread each, pinned to them) and the memory node that holds
its columns of every expert. ``"auto"`` makes one share a node with CPUs this process may use,
when there are two or more; ``"off"`` (or one such node) keeps one pool, as on a one-node
machine. A list of node ids picks nodes; a list of :class:`NumaShare` names CPUs and nodes
outright, e.g. two shares over the CPUs of one node ("virtual nodes", as the tests run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ktforge.detect.topology import Node, Topology, read_live


@dataclass(frozen=True)
class NumaShare:
    """CPUs that run a share's tasks, and the node whose memory holds its weights."""

    cpus: tuple[int, ...]
    node: int

    def __init__(self, cpus: Sequence[int], node: int) -> None:
        object.__setattr__(self, "cpus", tuple(int(c) for c in cpus))
        object.__setattr__(self, "node", int(node))


NumaSpec = str | Sequence[int] | Sequence[NumaShare]


def _memory_node(topology: Topology, node: Node) -> int:
    """The node itself where it has memory, else the nearest node that has (a CPU-only node of
    an NPS4 Threadripper, say)."""
    if node.memory_bytes is None or node.memory_bytes > 0:
        return node.id
    with_memory = [n for n in topology.nodes if (n.memory_bytes or 0) > 0]
    if not with_memory:
        return node.id
    return min(with_memory, key=lambda n: (node.distances.get(n.id, 255), n.id)).id


def _node_shares(topology: Topology, ids: Sequence[int]) -> list[NumaShare]:
    known = [n.id for n in topology.nodes]
    if len(set(ids)) != len(ids):
        raise ValueError(f"numa lists a node twice: {list(ids)}")
    shares = []
    for node_id in ids:
        if isinstance(node_id, bool) or not isinstance(node_id, int):
            raise ValueError(f"numa node ids are integers, got {node_id!r}")
        if node_id not in known:
            raise ValueError(f"NUMA node {node_id} does not exist; this machine has node(s) {known}")
        node = topology.node(node_id)
        if not node.usable_cpus:
            where = f"its CPUs {list(node.cpus)}" if node.cpus else "it has no CPUs (memory only)"
            raise ValueError(
                f"NUMA node {node_id} has no CPU this process may run on ({where}; this process may use "
                f"{list(topology.affinity or ())}); name nodes with usable CPUs, or widen the affinity"
            )
        shares.append(NumaShare(node.usable_cpus, _memory_node(topology, node)))
    return shares


def _check_explicit(topology: Topology, shares: Sequence[NumaShare]) -> list[NumaShare]:
    allowed = set(topology.affinity or ())
    seen: set[int] = set()
    known = [n.id for n in topology.nodes]
    for share in shares:
        if not share.cpus:
            raise ValueError("a NumaShare needs at least one CPU")
        outside = [c for c in share.cpus if c not in allowed]
        if outside:
            raise ValueError(f"NumaShare CPUs {outside} are not CPUs this process may run on ({sorted(allowed)})")
        if seen & set(share.cpus):
            raise ValueError(f"NumaShares overlap on CPUs {sorted(seen & set(share.cpus))}: give each its own")
        seen |= set(share.cpus)
        if share.node not in known:
            raise ValueError(f"NUMA node {share.node} does not exist; this machine has node(s) {known}")
    return list(shares)


def _with_threads(shares: list[NumaShare], threads: int | None) -> list[NumaShare]:
    """At most `threads` threads in all, in proportion to the shares' CPUs, one at least each."""
    if threads is None:
        return shares
    if threads < len(shares):
        raise ValueError(f"numa makes {len(shares)} pools (one a share), more than threads={threads}")
    total = sum(len(s.cpus) for s in shares)
    if threads >= total:
        return shares
    counts = [max(1, len(s.cpus) * threads // total) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: -len(shares[i].cpus)):  # the rest to the largest
        if sum(counts) >= threads:
            break
        counts[i] += min(threads - sum(counts), len(shares[i].cpus) - counts[i])
    return [NumaShare(s.cpus[:n], s.node) for s, n in zip(shares, counts, strict=True)]


def resolve(numa: NumaSpec, threads: int | None, topology: Topology | None = None) -> list[NumaShare]:
    """The shares a layer runs as; [] for one pool, today's layout."""
    if isinstance(numa, str):
        if numa == "off":
            return []
        if numa != "auto":
            raise ValueError(f"numa must be 'auto', 'off', a list of node ids or of NumaShare, got {numa!r}")
        topology = topology or read_live()
        nodes = topology.usable_nodes()
        if len(nodes) < 2:
            return []
        return _with_threads(_node_shares(topology, [n.id for n in nodes]), threads)
    items = list(numa)
    if not items:
        raise ValueError("numa lists no node")
    topology = topology or read_live()
    if all(isinstance(item, NumaShare) for item in items):
        return _with_threads(_check_explicit(topology, items), threads)  # type: ignore[arg-type]
    if any(isinstance(item, NumaShare) for item in items):
        raise ValueError("numa lists node ids or NumaShares, not both")
    return _with_threads(_node_shares(topology, items), threads)  # type: ignore[arg-type]
