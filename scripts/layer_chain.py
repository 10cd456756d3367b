"""Layers back to back, as a model calls them, against the same layer called alone.

A model runs its MoE layers one after another with a little other work between them. Each
call should cost what the layer costs alone: no thread wake-up, no contention from other
layers' idle workers. Prints, per method and token count, the median time per layer in a
chain of --layers layers and alone, and their ratio (1.00: nothing lost between layers),
from --rounds alternating rounds.

    python scripts/layer_chain.py --layers 8 --threads 2 --tokens 1,4 --methods bf16,int8,int4
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import ktforge

# Qwen3-30B-A3B's expert shapes, with fewer experts so that many layers fit in memory.
EXPERTS, TOP_K, HIDDEN, INTER = 32, 8, 2048, 768


def _layers(method: str, count: int, threads: int) -> list[Any]:
    rng = np.random.default_rng(0)
    gate, up = (rng.standard_normal((EXPERTS, INTER, HIDDEN), dtype=np.float32) / 32 for _ in range(2))
    down = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32) / 32
    layers = []
    for _ in range(count):
        moe = ktforge.MoE(EXPERTS, TOP_K, HIDDEN, INTER, method=method, threads=threads)
        moe.load_weights(gate, up, down)
        layers.append(moe)
    return layers


def _per_layer_ms(layers: list[Any], tokens: int, calls: int, rng: np.random.Generator) -> float:
    x = rng.standard_normal((tokens, HIDDEN), dtype=np.float32)
    weights = rng.random((tokens, TOP_K), dtype=np.float32)
    routes = [np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(tokens)]) for _ in range(calls)]
    start = time.perf_counter()
    for ids in routes:
        for moe in layers:
            y = moe.forward(x, ids, weights)
            x = x + y / (np.abs(y).max() + 1.0)  # a little work between layers (a residual, kept bounded)
    return (time.perf_counter() - start) * 1e3 / (calls * len(layers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", default="1,4")
    parser.add_argument("--methods", default="bf16,int8,int4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print(f"{args.layers} layers, {args.threads} threads, {args.rounds} alternating rounds of {args.calls} calls")
    print("method tokens  chain ms/layer  alone ms/layer  chain/alone  [range]  layers per pool")
    for method in args.methods.split(","):
        layers = _layers(method, args.layers, args.threads)
        pool = layers[0].info.get("pool_layers", 1)
        for tokens in (int(t) for t in args.tokens.split(",")):
            chain, alone = [], []
            for _ in range(args.rounds):
                chain.append(_per_layer_ms(layers, tokens, args.calls, rng))
                alone.append(_per_layer_ms(layers[:1], tokens, args.calls * len(layers), rng))
            ratios = [c / a for c, a in zip(chain, alone, strict=True)]
            print(
                f"{method:6} {tokens:6} {statistics.median(chain):15.3f} {statistics.median(alone):15.3f} "
                f"{statistics.median(ratios):12.2f}  [{min(ratios):.2f}-{max(ratios):.2f}]  {pool}"
            )
        del layers


if __name__ == "__main__":
    main()
