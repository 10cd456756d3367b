"""Weight quantization, defined once for the converter and for loading: the portable layout.

The arithmetic is the kernels' own (native/src/kernels/pack.cpp) in float32, step for step,
so weights quantized here and loaded with ``MoE.load_quantized`` give exactly the results of
``MoE.load_weights`` on the float weights (a test holds both to bit equality).

Layout, for a projection of ``N`` output rows and ``K`` inputs (``[..., N, K]`` in, as in
Hugging Face checkpoints):
- bf16: ``weight`` bfloat16 ``[..., N, K]`` (round to nearest even), no scale.
- int8: ``weight`` int8 ``[..., N, K]``, symmetric per output row: ``scale`` float32
  ``[..., N]`` = max|w| / 127 (1 for an all-zero row), ``q = clip(rint(w * (1 / scale)), ±127)``.
- int4: K zero-padded to ``Kg``, a multiple of ``group``; symmetric per (row, group):
  ``scale`` float32 ``[..., N, Kg / group]`` = max|w| / 7; ``q`` in [-7, 7] stored as
  ``q + 8``, two per byte, even k in the low nibble: ``weight`` uint8 ``[..., N, Kg / 2]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("bf16", "int8", "int4")
GROUP_SIZES = (32, 64, 128)

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Quantized:
    """One projection's weights in the portable layout; ``scale`` is None for bf16."""

    weight: Array
    scale: Array | None


def _symmetric_scale(max_abs: Array, qmax: int) -> Array:
    safe = np.where(max_abs > 0, max_abs, np.float32(qmax))
    return np.where(max_abs > 0, safe / np.float32(qmax), np.float32(1)).astype(np.float32)


def _round(w: Array, scale: Array, qmax: int) -> Array:
    inverse = (np.float32(1) / scale).astype(np.float32)
    return np.clip(np.rint(w * inverse), -qmax, qmax).astype(np.int8)


def quantize(w: Array, method: str, group_size: int = 128) -> Quantized:
    """Quantizes float weights ``[..., N, K]`` (float32, or anything that widens to it exactly)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "bf16":
        import ml_dtypes

        return Quantized(np.ascontiguousarray(w, dtype=ml_dtypes.bfloat16), None)
    w = np.asarray(w, dtype=np.float32)
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or infinite values")
    if method == "int8":
        scale = _symmetric_scale(np.abs(w).max(axis=-1), 127)
        return Quantized(_round(w, scale[..., None], 127), scale)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    K = w.shape[-1]
    padded = -(-K // group_size) * group_size
    if padded != K:
        w = np.concatenate([w, np.zeros((*w.shape[:-1], padded - K), np.float32)], axis=-1)
    grouped = w.reshape(*w.shape[:-1], padded // group_size, group_size)
    scale = _symmetric_scale(np.abs(grouped).max(axis=-1), 7)
    q = (_round(grouped, scale[..., None], 7).reshape(w.shape) + 8).astype(np.uint8)
    return Quantized(np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4)), scale)


def dequantize(q: Quantized, method: str, K: int) -> Array:
    """The float32 weights ``[..., N, K]`` a quantized projection stands for."""
    if method == "bf16":
        return np.asarray(q.weight, dtype=np.float32)
    assert q.scale is not None
    if method == "int8":
        return q.weight.astype(np.float32) * q.scale[..., None]
    low = (q.weight & 0x0F).astype(np.int8) - 8
    high = (q.weight >> 4).astype(np.int8) - 8
    values = np.stack([low, high], axis=-1).reshape(*q.weight.shape[:-1], -1).astype(np.float32)
    groups = q.scale.shape[-1]
    grouped = values.reshape(*values.shape[:-1], groups, -1) * q.scale[..., None]
    return grouped.reshape(values.shape)[..., :K]


def shapes(method: str, N: int, K: int, group_size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-expert shape and safetensors dtype of ``weight`` and ``scale`` for one projection."""
    if method == "bf16":
        return {"weight": ((N, K), "BF16")}
    if method == "int8":
        return {"weight": ((N, K), "I8"), "scale": ((N,), "F32")}
    groups = -(-K // group_size)
    return {"weight": ((N, groups * group_size // 2), "U8"), "scale": ((N, groups), "F32")}
