"""Verification of a freshly built wheel: run as ``python -S -m ktforge.builder.verify`` from the
unpacked wheel (ktforge.builder.executor does), it checks every compiled backend that runs here, for
every method, against the reference backend on random data, and a GEMM through the linked
AOCL-BLAS where the build has one. Prints one JSON list of results on its last line.
"""

from __future__ import annotations

import json
from typing import TypedDict

# small, with sizes that are no multiple of the kernels' blocks (ragged tails everywhere)
E, K, H, I = 4, 2, 72, 40
# Token counts, each with its bound relative to the reference: 9 (a few an expert: the decode
# kernels, which follow the reference's order and rounding) and 80 (40 an expert: the prefill
# kernels, AMX tiles included, which round fp8's activations to bf16 (3.5e-3 here) and sum in
# the tiles' order; 1e-2 still tells them from the wrong answer of a miscompiled kernel)
CASES = ((9, 1e-4), (80, 1e-2))


class Verified(TypedDict):
    """One backend and method checked against the reference."""

    backend: str
    method: str
    tokens: int
    kernel: str
    rel_err: float
    ok: bool


def results() -> list[Verified]:
    import numpy as np

    import ktforge
    import ktforge._native as native
    from ktforge import formats

    rng = np.random.default_rng(0)
    gate = (rng.standard_normal((E, I, H)) / 8).astype(np.float32)
    up = (rng.standard_normal((E, I, H)) / 8).astype(np.float32)
    down = (rng.standard_normal((E, H, I)) / 6).astype(np.float32)
    T_max = max(tokens for tokens, _ in CASES)
    x = rng.standard_normal((T_max, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T_max)]).astype(np.int64)
    w = rng.random((T_max, K)).astype(np.float32)
    info = native.build_info()
    out: list[Verified] = []
    for method in formats.names():
        group = min(formats.by_name(method).group_sizes, default=32)  # the smallest: the most group ends
        layers = {}
        for backend in ["reference", *(b["name"] for b in info["backends"] if b["runs_here"])]:
            layers[backend] = ktforge.MoE(E, K, H, I, method=method, backend=backend, group_size=group)
            layers[backend].load_weights(gate, up, down)
        for tokens, bound in CASES:
            expected = layers["reference"].forward(x[:tokens], ids[:tokens], w[:tokens])
            for backend, moe in layers.items():
                if backend == "reference":
                    continue
                got = moe.forward(x[:tokens], ids[:tokens], w[:tokens])
                err = float(np.abs(got - expected).max() / np.abs(expected).max())
                kernel = moe.info["kernel"]
                out.append(
                    {
                        "backend": backend,
                        "method": method,
                        "tokens": tokens,
                        "kernel": kernel,
                        "rel_err": err,
                        "ok": err < bound,
                    }
                )
    if info.get("blis"):
        ok = bool(native.blis_gemm_selftest())
        out.append(
            {
                "backend": "blis",
                "method": "int8",
                "tokens": 3,
                "kernel": info["blis"]["version"],
                "rel_err": 0.0,
                "ok": ok,
            }
        )
    return out


def main() -> None:
    print(json.dumps(results()))


if __name__ == "__main__":
    main()
