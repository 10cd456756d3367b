"""A GGUF layer's one-token decode with its weights in cache beside the same decode streaming them.

Decode (a token or a few) is meant to run at the machine's read bandwidth. It can only if the
kernels consume bytes faster than memory delivers them: with the same top-k experts every call
their weights stay in the last-level cache, and the rate (bytes of those experts per second)
is the kernels' own ceiling; with fresh uniform routing every call the weights come from
memory. Prints, per file, both rates as medians of --calls calls over --rounds alternating
rounds, the read bandwidth measured between them, and their ratios. A format whose in-cache
rate is below the read bandwidth is bound by its kernels' instructions, not by its bytes.

    python scripts/decode_in_cache.py model-q2_k.gguf model-q3_k.gguf --backend avx512 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import ktforge
from ktforge.bench.bounds import measure_read, read_buffer_bytes


def _median_ms(moe: ktforge.MoE, calls: int, same_experts: bool, rng: np.random.Generator) -> float:
    x = rng.standard_normal((1, moe.hidden_size), dtype=np.float32)
    weights = np.full((1, moe.top_k), 1 / moe.top_k, np.float32)
    fixed = np.arange(moe.top_k, dtype=np.int64)[None]
    times = []
    for call in range(calls + calls // 5):  # the first fifth warms up (pages, caches, the pool)
        ids = fixed if same_experts else rng.permutation(moe.num_experts)[None, : moe.top_k].astype(np.int64)
        start = time.perf_counter()
        moe.forward(x, ids, weights)
        if call >= calls // 5:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", nargs="+", type=Path)
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    layers = {
        path: ktforge.MoE.from_pretrained(path, args.layer, backend=args.backend, threads=args.threads)
        for path in args.gguf
    }
    rates: dict[Path, dict[str, list[float]]] = {p: {"cache": [], "memory": [], "read": []} for p in layers}
    for _ in range(args.rounds):
        for path, moe in layers.items():
            info = moe.info
            touched = moe.top_k * int(info["packed_bytes"]) / moe.num_experts  # bytes of a token's experts
            for where, same in (("cache", True), ("memory", False)):
                rates[path][where].append(touched / _median_ms(moe, args.calls, same, rng) / 1e6)
            backend = str(info["name"]).replace("-model", "")
            rates[path]["read"].append(measure_read(backend, args.threads, read_buffer_bytes(quick=True), 3))
    print(f"1 token, {args.threads} threads, {args.rounds} rounds x {args.calls} calls; GB/s of the experts' bytes")
    print("| file | format | in cache | from memory | read bandwidth | memory / read | cache / read |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path, r in rates.items():
        cache, memory, read = (statistics.median(r[k]) for k in ("cache", "memory", "read"))
        per_round = [m / b for m, b in zip(r["memory"], r["read"], strict=True)]
        print(
            f"| {path.name} | {layers[path].info['method']} | {cache:.1f} | {memory:.1f} | {read:.1f} "
            f"| {statistics.median(per_round):.2f} [{min(per_round):.2f}-{max(per_round):.2f}] | {cache / read:.2f} |"
        )


if __name__ == "__main__":
    main()
