"""Where the AMX tiles beat AVX-512 (a benchmark for AMX machines, not a test).

The `amx` backend runs a format's prefill on tiles from a count of tokens per expert
(kAmx*MinRows in native/src/arch/x86/amx/kernels.cpp), and the integer formats only at groups
of kAmxMinIntegerGroup or more: those thresholds are measurements. This script makes them: a
layer of 8 experts (Qwen3-30B-A3B's 2048 x 768) with every token routed to each, so the tokens
per expert are the tokens, timed on `amx` and `avx512` in alternating rounds, and prints the
median of the rounds' amx/avx512 ratios with their range. Compare a format at group sizes by
naming them: the integer formats' group decides whether the tiles run at all.

    python scripts/tile_crossover.py --methods int4,q2_k,q8_0 --tokens 16,32,64,128 --group-size 32
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import ktforge
from ktforge import formats
from ktforge.bench.timing import median_call_s

EXPERTS, HIDDEN, INTER = 8, 2048, 768


def _call_ms(moe: ktforge.MoE, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, calls: int) -> float:
    moe.forward(x, ids, weights)  # untimed: pages, caches, the pool
    return median_call_s(moe, x, ids, weights, calls) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="bf16,int8,int4,int8g,fp8,q2_k,q3_k,q4_k,q6_k,q8_0")
    parser.add_argument("--tokens", default="16,32,64,128", help="tokens per expert")
    parser.add_argument("--group-size", type=int, default=None, help="for the formats with a choice (default: 128)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per round (their median)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    gate, up = (rng.standard_normal((EXPERTS, INTER, HIDDEN), dtype=np.float32) / 50 for _ in range(2))
    down = rng.standard_normal((EXPERTS, HIDDEN, INTER), dtype=np.float32) / 50
    print(f"{'method':8} {'group':>5} {'tokens':>6} {'amx ms':>9} {'avx512 ms':>10}  amx/avx512 [range]  amx kernel")
    for method in args.methods.split(","):
        sizes = formats.by_name(method).group_sizes
        group = (args.group_size if args.group_size in sizes else max(sizes)) if sizes else 128  # 128: the default
        layers = {}
        for backend in ("amx", "avx512"):
            moe = ktforge.MoE(
                EXPERTS, EXPERTS, HIDDEN, INTER, method=method, backend=backend, threads=args.threads, group_size=group
            )
            moe.load_weights(gate, up, down)
            layers[backend] = moe
        for tokens in (int(t) for t in args.tokens.split(",")):
            x = rng.standard_normal((tokens, HIDDEN), dtype=np.float32)
            ids = np.tile(np.arange(EXPERTS, dtype=np.int64), (tokens, 1))
            weights = np.full((tokens, EXPERTS), 1 / EXPERTS, np.float32)
            ms: dict[str, list[float]] = {backend: [] for backend in layers}
            for r in range(args.rounds):
                for backend in sorted(layers, reverse=r % 2 == 1):  # alternating which goes first
                    ms[backend].append(_call_ms(layers[backend], x, ids, weights, args.calls))
            ratios = [a / b for a, b in zip(ms["amx"], ms["avx512"], strict=True)]
            print(
                f"{method:8} {group if sizes else '-':>5} {tokens:6} {statistics.median(ms['amx']):9.2f} "
                f"{statistics.median(ms['avx512']):10.2f}  {statistics.median(ratios):.2f} "
                f"[{min(ratios):.2f}-{max(ratios):.2f}]  {layers['amx'].info['kernel'].split(', else')[0]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
