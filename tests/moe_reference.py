"""NumPy definition of what ktforge's MoE layer computes, quantization included.

`expected(...)` mirrors the kernels' arithmetic (bf16 rounding, symmetric int8/int4
quantization with the same rounding rules) so backends can be compared tightly;
`float_reference(...)` is the unquantized float64 layer, for accuracy bounds.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

F32 = np.float32
Array = np.ndarray[Any, Any]


def bf16_round(a: Array) -> Array:
    return np.asarray(a, dtype=F32).astype(ml_dtypes.bfloat16).astype(F32)


def silu(x: Array) -> Array:
    return x / (1.0 + np.exp(-x))


def quantize_rows(a: Array, qmax: int) -> tuple[Array, Array]:
    """Symmetric per-row quantization as the kernels do it (float32 arithmetic)."""
    a = np.asarray(a, dtype=F32)
    max_abs = np.abs(a).max(axis=-1)
    scale = np.where(max_abs > 0, max_abs / F32(qmax), F32(1)).astype(F32)
    inv = (F32(1) / scale).astype(F32)
    q = np.clip(np.rint(a * inv[..., None]), -qmax, qmax).astype(np.int64)
    return q, scale


def quantize_groups(w: Array, group: int) -> tuple[Array, Array]:
    """int4 weights: [N, K] -> q [N, Kp], scale [N, G], K zero-padded to a multiple of group."""
    n, k = w.shape
    kp = -(-k // group) * group
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // group, group)
    q, scale = quantize_rows(grouped, 7)
    return q.reshape(n, kp), scale


def _matmul(x: Array, w: Array, method: str, group: int) -> Array:
    """x [M, K] float32 activations, w [N, K] float32 weights -> [M, N] float32."""
    if method == "bf16":
        return (bf16_round(x).astype(np.float64) @ bf16_round(w).astype(np.float64).T).astype(F32)
    xq, sx = quantize_rows(x, 127)
    if method == "int8":
        wq, sw = quantize_rows(w, 127)
        acc = (xq @ wq.T).astype(F32)
        return (acc * (sw[None, :] * sx[:, None])).astype(F32)
    wq, sw = quantize_groups(w, group)
    kp = wq.shape[1]
    xp = np.zeros((x.shape[0], kp), dtype=np.int64)
    xp[:, : x.shape[1]] = xq
    groups = kp // group
    acc = np.einsum("mgk,ngk->mng", xp.reshape(-1, groups, group), wq.reshape(-1, groups, group)).astype(F32)
    return ((acc * sw[None, :, :]).sum(axis=-1) * sx[:, None]).astype(F32)


def expected(
    x: Array, ids: Array, weights: Array, gate: Array, up: Array, down: Array, method: str, group: int = 128
) -> Array:
    x = np.asarray(x, dtype=F32)
    out = np.zeros((x.shape[0], down.shape[1]), dtype=np.float64)
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        xe = x[tokens]
        a = (silu(_matmul(xe, gate[e], method, group)) * _matmul(xe, up[e], method, group)).astype(F32)
        d = _matmul(a, down[e], method, group)
        out[tokens] += weights[tokens, slots][:, None].astype(np.float64) * d
    return out.astype(F32)


def float_reference(x: Array, ids: Array, weights: Array, gate: Array, up: Array, down: Array) -> Array:
    x64 = np.asarray(x, dtype=np.float64)
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t]):
            a = silu(gate[e].astype(np.float64) @ x64[t]) * (up[e].astype(np.float64) @ x64[t])
            out[t] += float(weights[t, j]) * (down[e].astype(np.float64) @ a)
    return out
