"""Decode of one MoE layer split over NUMA nodes beside the same layer on one node, in one run.

On a machine with several usable nodes it times MoE(numa="auto") (one share a node) against
numa=[first node] (that node's threads and memory alone) and numa="off" (one unpinned pool over
every CPU, pages wherever first touch put them): the issue's target is auto >= 1.8x one node on
two sockets. On a one-node machine it times two virtual shares (disjoint halves of the CPUs)
against numa="off": the cost of the split itself, which should be nil. Rounds alternate the
layers, so the machine's drift falls on all; prints each layer's median ms, and per round the
ratio to the baseline (median and range). Every layer's output is checked equal to the baseline's.

    python scripts/numa_decode.py --method int4 --experts 128 --hidden 2048 --intermediate 768 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

import ktforge
from ktforge.detect.topology import read_live
from ktforge.kernels.numa import NumaShare


def layouts() -> dict[str, Any]:
    """The numa= values to compare, the baseline first."""
    nodes = read_live().usable_nodes()
    if len(nodes) > 1:
        return {f"one node ({nodes[0].id})": [nodes[0].id], "auto": "auto", "off": "off"}
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("virtual nodes need two CPUs")
    half = len(cpus) // 2
    return {
        "off": "off",
        "virtual 2 shares": [NumaShare(cpus[:half], nodes[0].id), NumaShare(cpus[half:], nodes[0].id)],
    }


def median_ms(moe: ktforge.MoE, tokens: int, calls: int, rng: np.random.Generator) -> tuple[float, Any]:
    x = rng.standard_normal((tokens, moe.hidden_size), dtype=np.float32)
    weights = np.full((tokens, moe.top_k), 1 / moe.top_k, np.float32)
    times, out = [], None
    for call in range(calls + calls // 5):  # the first fifth warms up
        ids = np.stack([rng.permutation(moe.num_experts)[: moe.top_k] for _ in range(tokens)]).astype(np.int64)
        start = time.perf_counter()
        out = moe.forward(x, ids, weights)
        if call >= calls // 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="int4")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    E, H, I = args.experts, args.hidden, args.intermediate
    gate, up = (rng.standard_normal((E, I, H), dtype=np.float32) / 16 for _ in range(2))
    down = rng.standard_normal((E, H, I), dtype=np.float32) / 16
    layers = {}
    for name, numa in layouts().items():
        moe = ktforge.MoE(E, args.top_k, H, I, method=args.method, numa=numa)
        moe.load_weights(gate, up, down)
        layers[name] = moe
        shares = moe.info["numa_shares"]
        where = "; ".join(
            f"node {s['node']}: {s['threads']} thr, {s['pages_on_node']}/{s['pages_sampled']} pages" for s in shares
        )
        print(f"{name}: {moe.info['threads']} threads{', ' + where if where else ''}")
    times: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(args.rounds):
        seed = int(rng.integers(1 << 30))
        outputs = {}
        for name, moe in layers.items():  # the same routing for each layer in a round
            ms, outputs[name] = median_ms(moe, args.tokens, args.calls, np.random.default_rng(seed))
            times[name].append(ms)
        first = next(iter(outputs.values()))
        assert all(np.array_equal(first, o) for o in outputs.values()), "a split changed the result"
    baseline = next(iter(layers))
    print(f"{args.method}, {E} experts top-{args.top_k}, {H} x {I}, {args.tokens} token(s), {args.rounds} rounds")
    for name in layers:
        ratios = [b / t for b, t in zip(times[baseline], times[name], strict=True)]
        print(
            f"  {name:18} {statistics.median(times[name]):8.3f} ms   speed vs {baseline}: "
            f"{statistics.median(ratios):.3f}x (range {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
