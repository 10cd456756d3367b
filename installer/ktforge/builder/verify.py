"""Verification of a freshly built wheel: run as ``python -S -m ktforge.builder.verify`` from the
unpacked wheel (ktforge.builder.executor does), it checks every compiled backend that runs here, for
every method, against the reference backend on random data, and a GEMM through the linked
AOCL-BLAS where the build has one. Prints one JSON list of results on its last line.
"""

from __future__ import annotations

import json
from typing import TypedDict

# small, with sizes that are no multiple of the kernels' blocks (ragged tails everywhere)
E, K, H, I, T = 4, 2, 72, 40, 9
TOLERANCE = 1e-4  # relative to the reference: the backends follow its order and rounding


class Verified(TypedDict):
    """One backend and method checked against the reference."""

    backend: str
    method: str
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
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
    w = rng.random((T, K)).astype(np.float32)
    info = native.build_info()
    out: list[Verified] = []
    for method in formats.names():
        group = min(formats.by_name(method).group_sizes, default=32)  # the smallest: the most group ends
        ref = ktforge.MoE(E, K, H, I, method=method, backend="reference", group_size=group)
        ref.load_weights(gate, up, down)
        expected = ref.forward(x, ids, w)
        for backend in info["backends"]:
            if backend["name"] == "reference" or not backend["runs_here"]:
                continue
            moe = ktforge.MoE(E, K, H, I, method=method, backend=backend["name"], group_size=group)
            moe.load_weights(gate, up, down)
            err = float(np.abs(moe.forward(x, ids, w) - expected).max() / np.abs(expected).max())
            kernel = moe.info["kernel"]
            out.append(
                {"backend": backend["name"], "method": method, "kernel": kernel, "rel_err": err, "ok": err < TOLERANCE}
            )
    if info.get("blis"):
        ok = bool(native.blis_gemm_selftest())
        out.append({"backend": "blis", "method": "int8", "kernel": info["blis"]["version"], "rel_err": 0.0, "ok": ok})
    return out


def main() -> None:
    print(json.dumps(results()))


if __name__ == "__main__":
    main()
