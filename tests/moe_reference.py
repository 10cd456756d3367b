"""NumPy definition of what ktforge's MoE layer computes, quantization included, and the
inputs the kernel tests share (shapes, layers, routings).

`expected(...)` mirrors the kernels' arithmetic (bf16 rounding, symmetric int8/int4
quantization with the same rounding rules) so backends can be compared tightly;
`float_reference(...)` is the unquantized float64 layer, for accuracy bounds.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import ml_dtypes
import numpy as np

import ktforge.formats

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
    scale = (max_abs / F32(qmax)).astype(F32)
    scale = np.where(scale >= np.finfo(F32).tiny, scale, F32(1)).astype(F32)  # zero or subnormal rows
    inv = (F32(1) / scale).astype(F32)
    q = np.clip(np.rint(a * inv[..., None]), -qmax, qmax).astype(np.int64)
    return q, scale


def quantize_blocks(a: Array, block: int, kp: int | None = None) -> tuple[Array, Array]:
    """int8 activations as the kernels take them: [M, K] zero-padded to kp (a multiple of block;
    default K rounded up to it), a symmetric scale per ``block`` values of K -> q [M, kp], scale
    [M, kp / block]."""
    a = np.asarray(a, dtype=F32)
    m, k = a.shape
    kp = kp or -(-k // block) * block
    padded = np.zeros((m, kp), dtype=F32)
    padded[:, :k] = a
    q, scale = quantize_rows(padded.reshape(m, kp // block, block), 127)
    return q.reshape(m, kp), scale


def dequantize_blocks(a: Array, block: int) -> Array:
    """float64 [M, K] of ``a`` as int8 activations per ``block`` values of K (``quantize_blocks``)."""
    q, scale = quantize_blocks(a, block)
    m, k = np.shape(a)
    values = q.reshape(m, -1, block).astype(np.float64) * scale[..., None].astype(np.float64)
    return values.reshape(m, -1)[:, :k]  # type: ignore[no-any-return]


def blocks_of(moe: Any) -> tuple[int, int]:
    """An int8-activation layer's activation blocks: gate/up's input, down's (``activation_block``)."""
    return (
        activation_block(moe.method, moe._group, moe.hidden_size),
        activation_block(moe.down_method, moe._down_group, moe.intermediate_size),
    )


def activation_block(method: str, group: int, kp: int) -> int:
    """Values of K an int8 activation scale covers for a format (formats.json's activation_block)."""
    f = ktforge.formats.by_name(method)
    return f.activation_values(ktforge.formats.group_for(method, group), kp)


def quantize_groups(w: Array, group: int) -> tuple[Array, Array]:
    """int4 weights: [N, K] -> q [N, Kp], scale [N, G], K zero-padded to a multiple of group."""
    n, k = w.shape
    kp = -(-k // group) * group
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // group, group)
    # all 16 codes, as llama.cpp's Q4_0: the first w of the largest |w| is code -8, its scale
    # -w / 8 rounded to bf16 (1 for a group of zeros); the others round into [-8, 7]
    first = np.take_along_axis(grouped, np.abs(grouped).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    scale = (np.abs(first) / F32(8)).astype(F32)
    scale = np.where(scale >= np.finfo(F32).tiny, np.where(first > 0, -scale, scale), F32(1)).astype(F32)
    scale = bf16_round(scale)
    q = np.clip(np.rint(grouped * (F32(1) / scale)[..., None]), -8, 7).astype(np.int64)
    return q.reshape(n, kp), scale


def quantize_int8_groups(w: Array, group: int) -> tuple[Array, Array]:
    """int8g weights: [N, K] -> q [N, Kp] in [-127, 127], scale [N, G], K zero-padded to a
    multiple of group. The scale: of the bf16 value nearest max|w| / 127 and its two bf16
    neighbours, the one with the least sum of (q * scale - w)^2 over the group (the nearest on
    ties); 1 for a group of zeros."""
    n, k = w.shape
    kp = -(-k // group) * group
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // group, group)
    exact = (np.abs(grouped).max(axis=-1) / F32(127)).astype(F32)
    nonzero = exact >= np.finfo(F32).tiny
    nearest = bf16_round(np.where(nonzero, exact, F32(1))).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)

    def codes(scale: Array) -> Array:
        return np.clip(np.rint(grouped * (F32(1) / scale)[..., None]), -127, 127)

    def error(scale: Array) -> Array:
        d = (codes(scale) * scale[..., None]).astype(F32) - grouped
        return (d.astype(np.float64) ** 2).sum(axis=-1)

    def as_float(bits: Array) -> Array:
        return (bits.astype(np.uint32) << np.uint32(16)).view(F32)

    scale = as_float(nearest)
    least = error(scale)
    for step in (-1, 1):
        bits = nearest + step
        candidate = as_float(np.clip(bits, 0x0080, 0x7F7F))
        e = error(candidate)
        better = nonzero & (bits >= 0x0080) & (bits < 0x7F80) & (e < least)
        scale, least = np.where(better, candidate, scale), np.where(better, e, least)
    return codes(scale).astype(np.int64).reshape(n, kp), scale


def quantize_fp8_blocks(w: Array, group: int = 128) -> tuple[Array, Array]:
    """fp8 weights as MoE.load_weights packs them: [N, K] -> E4M3 codes [N, K] (ml_dtypes'
    float8_e4m3fn, round to nearest even) and float32 scales [ceil(N / 16), ceil(K / group)],
    one per 16-row block and group of K: max|w| / 448 (1 for a block of zeros)."""
    n, k = w.shape
    gn, gk = -(-n // 16), -(-k // group)
    padded = np.zeros((gn * 16, gk * group), dtype=F32)
    padded[:n, :k] = w
    max_abs = np.abs(padded.reshape(gn, 16, gk, group)).max(axis=(1, 3))
    scale = np.where(max_abs >= np.finfo(F32).tiny, max_abs / F32(448), F32(1)).astype(F32)
    per_value = np.repeat(np.repeat(scale, 16, axis=0), group, axis=1)[:n, :k]
    return (np.asarray(w, F32) / per_value).astype(ml_dtypes.float8_e4m3fn), scale


def dequantize_fp8_blocks(codes: Array, scale: Array, rows: int, group: int) -> Array:
    """float64 weights of E4M3 codes [N, K] with scales per ``rows`` x ``group`` block."""
    n, k = codes.shape
    per_value = np.repeat(np.repeat(scale.astype(np.float64), rows, axis=0), group, axis=1)[:n, :k]
    return codes.astype(np.float64) * per_value


def quantize_mxfp8(w: Array) -> tuple[Array, Array]:
    """mxfp8 weights as MoE.load_weights packs them: [N, K] -> E4M3 codes [N, K] (ml_dtypes'
    float8_e4m3fn of w / 2^s, round to nearest even) and E8M0 codes [N, ceil(K / 32)]: per row and
    32 values the least power of two 2^s with max|w| / 2^s <= 448 (1 for a group of zeros)."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    max_abs = np.abs(padded.reshape(n, -1, 32)).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore"):
        s = np.where(max_abs > 0, np.ceil(np.log2(max_abs / 448.0)), 0).astype(np.int64)
    per_value = np.repeat(np.ldexp(1.0, s), 32, axis=1)[:, :k]
    codes = (np.asarray(w, np.float64) / per_value).astype(F32).astype(ml_dtypes.float8_e4m3fn)
    return codes, (s + 127).astype(np.uint8)


def dequantize_mxfp8(codes: Array, e8m0: Array) -> Array:
    """float64 [N, K] of E4M3 codes and their E8M0 scales per 32 values."""
    per_value = np.repeat(np.ldexp(1.0, e8m0.astype(np.int64) - 127), 32, axis=-1)[..., : codes.shape[-1]]
    return codes.astype(np.float64) * per_value  # type: ignore[no-any-return]


def quantize_int4z(w: Array, group: int) -> tuple[Array, Array, Array]:
    """Asymmetric INT4 (GPTQ's and compressed-tensors' min/max grid): [N, K] -> q [N, Kp] in [0, 15],
    scale [N, G] float32, zero [N, G] in [0, 15]; per group the range [min(w, 0), max(w, 0)] in 15
    steps (scale 1 where it is 0), zero = rint(-min / scale), q = clip(rint(w / scale) + zero)."""
    n, k = w.shape
    kp = -(-k // group) * group
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // group, group)
    low, high = np.minimum(grouped.min(axis=-1), F32(0)), np.maximum(grouped.max(axis=-1), F32(0))
    scale = ((high - low) / F32(15)).astype(F32)
    scale = np.where(scale > 0, scale, F32(1)).astype(F32)
    zero = np.clip(np.rint(-low / scale), 0, 15).astype(np.int64)
    q = np.clip(np.rint(grouped / scale[..., None]).astype(np.int64) + zero[..., None], 0, 15)
    return q.reshape(n, kp), scale, zero


def quantize_q8_0(w: Array) -> tuple[Array, Array]:
    """GGUF's Q8_0 as MoE.load_weights packs floats: per 32 (K zero-padded) d = max|w| / 127 in
    float16 (1 where that is below float16's smallest normal), q = clip(rint(w / d), ±127)."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 32, 32)
    d = (np.abs(grouped).max(axis=-1) / F32(127)).astype(F32)
    d = np.where(d >= F32(2.0**-14), d.astype(np.float16).astype(F32), F32(1)).astype(F32)
    q = np.clip(np.rint(grouped * (F32(1) / d)[..., None]), -127, 127).astype(np.int64)
    return q.reshape(n, kp), d


def quantize_q4k(w: Array, levels: int = 15, group: int = 32, top: int = 63) -> tuple[Array, Array, Array]:
    """GGUF's Q4_K as MoE.load_weights packs floats: [N, K] -> q [N, Kp] in [0, 15] (K zero-padded
    to 256), each group's scale d * sc and min dmin * m [N, Kp / 32] float32; per 32 the range
    [min(w, 0), max(w, 0)] in 15 steps, per 256 d = max step / 63 and dmin = max -min / 63 in
    float16, sc = rint(step / d) and m = rint(-min / dmin) in [0, 63], q = clip(rint((w + dmin * m)
    / (d * sc)), 0, 15). Q5_K (levels 31): the same in 31 steps, q in [0, 31]. Q2_K (levels 3, group
    16, top 15): per 16 in 3 steps, d, dmin per 256 over 15, sc and m in [0, 15]."""
    n, k = w.shape
    kp = -(-k // 256) * 256
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 256, 256 // group, group)
    low = -np.minimum(grouped.min(axis=-1), F32(0))
    step = ((np.maximum(grouped.max(axis=-1), F32(0)) + low) / F32(levels)).astype(F32)
    d = (step.max(axis=-1) / F32(top)).astype(np.float16).astype(F32)[..., None]
    dmin = (low.max(axis=-1) / F32(top)).astype(np.float16).astype(F32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.rint(step / d), 0, top), 0).astype(F32)
        m = np.where(dmin > 0, np.clip(np.rint(low / dmin), 0, top), 0).astype(F32)
        scale, minimum = (d * sc).astype(F32), (dmin * m).astype(F32)
        q = np.where(
            scale[..., None] > 0,
            np.clip(np.rint((grouped + minimum[..., None]) / scale[..., None]), 0, levels),
            0,
        )
    return q.reshape(n, kp).astype(np.int64), scale.reshape(n, -1), minimum.reshape(n, -1)


IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)


def quantize_iq4(w: Array, xs: bool) -> tuple[Array, Array]:
    """GGUF's IQ4_NL (xs False) or IQ4_XS as MoE.load_weights packs floats: [N, K] -> the grid's
    values [N, Kp] (K zero-padded to 32, or 256) and each group's scale [N, Kp / 32] float32. Per 32
    m / -127 for the group's first value m of the largest magnitude; IQ4_NL: that in float16;
    IQ4_XS: per 256 d = the largest |m / -127| / 31 in float16, sc = rint((m / -127) / d) in [-32,
    31], the scale d * sc. Each value the grid's nearest to w / scale (the first of two as near;
    the nearest to 0 where the scale is 0)."""
    n, k = w.shape
    step = 256 if xs else 32
    kp = -(-k // step) * step
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 32, 32)
    first = np.abs(grouped).argmax(axis=-1)
    m = np.take_along_axis(grouped, first[..., None], axis=-1)[..., 0]
    scale = (m / F32(-127)).astype(F32)
    if xs:
        supers = scale.reshape(n, -1, 8)
        d = (np.abs(supers).max(axis=-1) / F32(31)).astype(np.float16).astype(F32)[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(d > 0, np.clip(np.rint(supers / d), -32, 31), 0).astype(F32)
        scale = (d * sc).astype(F32).reshape(n, -1)
    else:
        scale = scale.astype(np.float16).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale[..., None] != 0, grouped / scale[..., None], F32(0)).astype(F32)
    codes = np.abs(ratio[..., None] - IQ4_GRID).argmin(axis=-1)
    return IQ4_GRID[codes].reshape(n, kp).astype(np.int64), scale


def quantize_q6k(w: Array, levels: int = 31, offset: int = 32, top: int = 127) -> tuple[Array, Array]:
    """GGUF's Q6_K as MoE.load_weights packs floats: [N, K] -> q [N, Kp] in [0, 63] (K zero-padded
    to 256) and each group's scale d * sc [N, Kp / 16] float32; per 16 a step of max|w| / 31, per
    256 d = max step / 127 in float16, sc = rint(step / d) in [0, 127], q = clip(rint(w / (d * sc))
    + 32, 0, 63) (32 where d * sc is 0). Q3_K (levels 3, offset 4, top 31): a step of max|w| / 3,
    d = max step / 31, sc in [0, 31], q in [0, 7] about 4."""
    n, k = w.shape
    kp = -(-k // 256) * 256
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 256, 16, 16)
    step = (np.abs(grouped).max(axis=-1) / F32(levels)).astype(F32)
    d = (step.max(axis=-1) / F32(top)).astype(np.float16).astype(F32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(np.rint(step / d), 0, top), 0).astype(F32)
        scale = (d * sc).astype(F32)
        q = np.where(
            scale[..., None] > 0, np.clip(np.rint(grouped / scale[..., None]) + offset, 0, 2 * offset - 1), offset
        )
    return q.reshape(n, kp).astype(np.int64), scale.reshape(n, -1)


def quantize_legacy(w: Array, method: str) -> tuple[Array, Array, Array, int]:
    """GGUF's Q4_0, Q4_1, Q5_0, Q5_1 as MoE.load_weights packs floats (llama.cpp's reference
    quantizers): [N, K] -> codes q [N, Kp] (K zero-padded to 32), d and m [N, Kp / 32] float32 and
    the codes' offset. _0: d = v / -offset in float16 for the group's first value v of the largest
    magnitude, m 0, offset 8 (Q5_0: 16); _1: d = (max - min) / top, m = min, both float16, offset 0;
    q = clip(rint((w - m) * (1 / d)) + offset, 0, top) (top 15, or 31 for 5 bits; 1 / 0 as 0)."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 32, 32)
    top = 15 if method in ("q4_0", "q4_1") else 31
    offset = {"q4_0": 8, "q5_0": 16}.get(method, 0)
    if offset:
        first = np.abs(grouped).argmax(axis=-1)
        largest = np.take_along_axis(grouped, first[..., None], axis=-1)[..., 0]
        d = (largest / F32(-offset)).astype(np.float16).astype(F32)
        m = np.zeros_like(d)
    else:
        lo, hi = grouped.min(axis=-1), grouped.max(axis=-1)
        d = ((hi - lo) / F32(top)).astype(np.float16).astype(F32)
        m = lo.astype(np.float16).astype(F32)
    with np.errstate(divide="ignore"):
        inverse = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    q = np.clip(np.rint((grouped - m[..., None]) * inverse[..., None]) + offset, 0, top)
    return q.reshape(n, kp).astype(np.int64), d, m, offset


def quantize_mxfp4(w: Array) -> tuple[Array, Array]:
    """MXFP4 weights: [N, K] -> E2M1 codes [N, Kp] (uint8, K zero-padded to a multiple of 32) and
    E8M0 codes [N, Kp / 32]: per group the least power of two 2^s with max|w| / 2^s <= 6 (1 for a
    group of zeros), the codes ml_dtypes' float4_e2m1fn cast of w / 2^s (round to nearest even)."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    grouped = padded.reshape(n, kp // 32, 32)
    max_abs = np.abs(grouped).max(axis=-1).astype(np.float64)
    with np.errstate(divide="ignore"):
        s = np.where(max_abs > 0, np.ceil(np.log2(max_abs / 6.0)), 0).astype(np.int64)
    s = np.clip(s, -127, 127)
    values = (grouped / np.ldexp(1.0, s)[..., None]).astype(F32)
    codes = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    return codes.reshape(n, kp), (s + 127).astype(np.uint8)


def dequantize_mxfp4(codes: Array, e8m0: Array) -> Array:
    """float64 [N, Kp] of E2M1 codes and their E8M0 group scales (ml_dtypes' decoding)."""
    values = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    scale = np.ldexp(1.0, e8m0.astype(np.int64) - 127)
    return (values.reshape(*e8m0.shape, -1) * scale[..., None]).reshape(codes.shape)


def ue4m3(codes: Array) -> Array:
    """float64 of UE4M3 codes (NVFP4's group scales): ml_dtypes' float8_e4m3fn decoding."""
    return codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # type: ignore[no-any-return]


def quantize_nvfp4(w: Array) -> tuple[Array, Array, Array]:
    """NVFP4 weights as NVIDIA ModelOpt quantizes a tensor, each row its own tensor: [N, K] -> E2M1
    codes [N, Kp] (K zero-padded to 16), UE4M3 codes [N, Kp / 16] and the global scales [N]:
    global = max|w| / (6 * 448) (1 for a zero row), per 16 values ml_dtypes' float8_e4m3fn of max|w| /
    6 / global, the codes ml_dtypes' float4_e2m1fn of w / (scale * global), all in float32."""
    n, k = w.shape
    kp = -(-k // 16) * 16
    padded = np.zeros((n, kp), dtype=F32)
    padded[:, :k] = w
    amax = np.abs(padded).max(axis=1)
    glob = np.where(amax >= np.finfo(F32).tiny, amax / F32(6 * 448), F32(1)).astype(F32)
    grouped = padded.reshape(n, kp // 16, 16)
    wanted = np.minimum(np.abs(grouped).max(axis=-1) / F32(6) / glob[:, None], F32(448))
    codes = wanted.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    scale = (ue4m3(codes).astype(F32) * glob[:, None]).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(scale[..., None] > 0, grouped / scale[..., None], F32(0)).astype(F32)
    e2m1 = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    return e2m1.reshape(n, kp), codes, glob


def dequantize_nvfp4(codes: Array, scale_codes: Array, glob: Array) -> Array:
    """float64 [N, Kp] of E2M1 codes, their UE4M3 group scales and each row's global scale."""
    values = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    grouped = values.reshape(*scale_codes.shape, -1) * ue4m3(scale_codes)[..., None]
    return grouped.reshape(codes.shape) * glob.astype(np.float64)[..., None]  # type: ignore[no-any-return]


def int8_matmul(a: Array, q: Array, scale: Array) -> Array:
    """int8 weights q [N, K] with a scale a row against activations a [M, K] as the kernels take
    them: exact int32 sums per activation block of K (activation_block), each times the block's
    activation scale, summed, times the row's scale."""
    kp = -(-q.shape[1] // 64) * 64
    block = activation_block("int8", 0, kp)
    aq, sa = quantize_blocks(a, block, kp)
    qp = np.pad(np.asarray(q, np.int64), ((0, 0), (0, kp - q.shape[1])))
    acc = np.einsum("mbk,nbk->mnb", aq.reshape(len(aq), -1, block), qp.reshape(len(qp), -1, block)).astype(F32)
    return ((acc * sa[:, None, :]).sum(axis=-1) * scale[None, :]).astype(F32)  # type: ignore[no-any-return]


def _matmul(x: Array, w: Array, method: str, group: int) -> Array:
    """x [M, K] float32 activations, w [N, K] float32 weights -> [M, N] float32."""
    if method == "bf16":
        return (bf16_round(x).astype(np.float64) @ bf16_round(w).astype(np.float64).T).astype(F32)
    if method in ("f16", "f32"):  # exact fp32 activations, the weights as float16 (or float32)
        wd = w.astype(np.float16 if method == "f16" else F32).astype(np.float64)
        return (np.asarray(x, np.float64) @ wd.T).astype(F32)
    if method in ("fp8", "mxfp8"):  # exact fp32 activations
        wd = (
            dequantize_fp8_blocks(*quantize_fp8_blocks(w, group), 16, group)
            if method == "fp8"
            else dequantize_mxfp8(*quantize_mxfp8(w))
        )
        return (np.asarray(x, np.float64) @ wd.T).astype(F32)
    if method == "int8":
        return int8_matmul(x, *quantize_rows(w, 127))

    # The grouped formats: each group's exact int32 sums [M, N, G] (``sums``), scaled by the
    # weights' group scales (and less their mins), times the token's activation scale of the
    # group's block, summed over the groups.
    def per_group(kp: int, size: int) -> tuple[Array, Array]:
        """The int8 activations [M, G, size] and each group's activation scale [M, 1, G]."""
        block = activation_block(method, group, kp)
        xq, sx = quantize_blocks(x, block, kp)
        return xq.reshape(x.shape[0], kp // size, size), np.repeat(sx, block // size, axis=1)[:, None, :]

    if method in ("mxfp4", "nvfp4") or method in LATTICE:  # the weights' values exact
        wd = (
            dequantize_mxfp4(*quantize_mxfp4(w))
            if method == "mxfp4"
            else dequantize_nvfp4(*quantize_nvfp4(w))
            if method == "nvfp4"
            else lattice_padded(w, method)
        )
        size = {"mxfp4": 32, "nvfp4": 16}.get(method, group)
        xg, sxg = per_group(wd.shape[1], size)
        acc = np.einsum("mgk,ngk->mng", xg.astype(np.float64), wd.reshape(wd.shape[0], -1, size))
        return (acc * sxg).sum(axis=-1).astype(F32)
    if method == "int4z":  # exact int32 group sums of (q - zero) * x, scaled per group
        wq, sw, zw = quantize_int4z(w, group)
        xg, sxg = per_group(wq.shape[1], group)
        centred = wq.reshape(wq.shape[0], -1, group) - zw[..., None]
        acc = np.einsum("mgk,ngk->mng", xg, centred).astype(F32)
        return (acc * sw[None] * sxg).sum(axis=-1).astype(F32)
    if method in ("q4_k", "q5_k", "q2_k"):  # exact int32 group sums of q * x, scaled, less min * the group's sum of x
        size = 16 if method == "q2_k" else 32
        wq, sw, mw = quantize_q4k(w, *({"q5_k": (31,), "q2_k": (3, 16, 15)}.get(method, (15,))))
        xg, sxg = per_group(wq.shape[1], size)
        acc = np.einsum("mgk,ngk->mng", xg, wq.reshape(wq.shape[0], -1, size)).astype(np.float64)
        sums = acc * sw[None] - xg.sum(axis=-1).astype(np.float64)[:, None, :] * mw[None].astype(np.float64)
        return (sums * sxg).sum(axis=-1).astype(F32)
    if method in ("q6_k", "q3_k"):  # exact int32 group sums of (q - offset) * x, scaled per group of 16
        offset = 32 if method == "q6_k" else 4
        wq, sw = quantize_q6k(w) if method == "q6_k" else quantize_q6k(w, 3, 4, 31)
        xg, sxg = per_group(wq.shape[1], 16)
        acc = np.einsum("mgk,ngk->mng", xg, (wq - offset).reshape(wq.shape[0], -1, 16))
        return (acc.astype(F32) * sw[None] * sxg).sum(axis=-1).astype(F32)
    if method in ("q4_0", "q4_1", "q5_0", "q5_1"):  # exact int32 group sums of (q - offset) * x, times d, + m * sum x
        wq, d, m, offset = quantize_legacy(w, method)
        xg, sxg = per_group(wq.shape[1], 32)
        acc = np.einsum("mgk,ngk->mng", xg, (wq - offset).reshape(wq.shape[0], -1, 32)).astype(np.float64)
        sums = acc * d[None] + xg.sum(axis=-1).astype(np.float64)[:, None, :] * m[None].astype(np.float64)
        return (sums * sxg).sum(axis=-1).astype(F32)
    if method in ("iq4_nl", "iq4_xs"):  # exact int32 group sums of grid values * x, scaled per group
        wq, sw = quantize_iq4(w, method == "iq4_xs")
        xg, sxg = per_group(wq.shape[1], 32)
        acc = np.einsum("mgk,ngk->mng", xg, wq.reshape(wq.shape[0], -1, 32))
        return (acc.astype(F32) * sw[None] * sxg).sum(axis=-1).astype(F32)
    if method == "q8_0":
        wq, sw = quantize_q8_0(w)
        size = 32
    else:
        wq, sw = quantize_int8_groups(w, group) if method == "int8g" else quantize_groups(w, group)
        size = group
    xg, sxg = per_group(wq.shape[1], size)
    acc = np.einsum("mgk,ngk->mng", xg, wq.reshape(wq.shape[0], -1, size)).astype(F32)
    return (acc * sw[None] * sxg).sum(axis=-1).astype(F32)


# GGUF's i-quants: their values are ktforge's own quantizer's (a grid search no mirror here would
# repeat in less than minutes), written as GGUF blocks that tests/kernels/test_lattice.py holds to
# gguf-py's dequantization; the kernels' sums over them are what this module computes.
LATTICE = ("iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s")


def lattice_padded(w: Array, method: str) -> Array:
    """float64 [N, Kp] (K zero-padded to 256) of the weights MoE.load_weights packs ``w`` into."""
    from ktforge.formats.quantize import dequantize, quantize

    kp = -(-w.shape[1] // 256) * 256
    return dequantize(quantize(w, method, 16 if method == "iq2_xs" else 32), method, kp).astype(np.float64)


def dequantized(w: Array, method: str, group: int) -> Array:
    """float64 [N, K] of the weights MoE.load_weights packs float32 ``w`` [N, K] into, in a grouped
    int8-activation format (this module's mirrors of its quantizers)."""
    n, k = w.shape

    def grouped(values: Array, scale: Array, size: int, minimum: Array | None = None) -> Array:
        out = values.reshape(n, -1, size).astype(np.float64) * scale[..., None].astype(np.float64)
        if minimum is not None:
            out = out + minimum[..., None].astype(np.float64)
        return out.reshape(n, -1)[:, :k]  # type: ignore[no-any-return]

    if method == "int8":  # a scale a row
        q, scale = quantize_rows(w, 127)
        return q.astype(np.float64) * scale[:, None].astype(np.float64)  # type: ignore[no-any-return]
    if method == "mxfp4":
        return dequantize_mxfp4(*quantize_mxfp4(w))[:, :k]
    if method == "nvfp4":
        return dequantize_nvfp4(*quantize_nvfp4(w))[:, :k]
    if method == "int4z":
        q, scale, zero = quantize_int4z(w, group)
        return grouped(q.reshape(n, -1, group) - zero[..., None], scale, group)
    if method in ("q4_k", "q5_k", "q2_k"):
        q, scale, minimum = quantize_q4k(w, *({"q5_k": (31,), "q2_k": (3, 16, 15)}.get(method, (15,))))
        return grouped(q, scale, 16 if method == "q2_k" else 32, -minimum)
    if method in ("q6_k", "q3_k"):
        q, scale = quantize_q6k(w) if method == "q6_k" else quantize_q6k(w, 3, 4, 31)
        return grouped(q - (32 if method == "q6_k" else 4), scale, 16)
    if method in ("q4_0", "q4_1", "q5_0", "q5_1"):
        q, d, m, offset = quantize_legacy(w, method)
        return grouped(q - offset, d, 32, m)
    if method in ("iq4_nl", "iq4_xs"):
        return grouped(*quantize_iq4(w, method == "iq4_xs"), 32)
    if method in LATTICE:
        return lattice_padded(w, method)[:, :k]  # type: ignore[no-any-return]
    if method == "q8_0":
        return grouped(*quantize_q8_0(w), 32)
    q, scale = quantize_int8_groups(w, group) if method == "int8g" else quantize_groups(w, group)
    return grouped(q, scale, group)


def expected(
    x: Array,
    ids: Array,
    weights: Array,
    gate: Array,
    up: Array,
    down: Array,
    method: str,
    group: int = 128,
    down_method: tuple[str, int] | None = None,
) -> Array:
    """The layer as the kernels define it (down in its own format and group, where given)."""
    x = np.asarray(x, dtype=F32)
    out = np.zeros((x.shape[0], down.shape[1]), dtype=np.float64)
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        xe = x[tokens]
        a = (silu(_matmul(xe, gate[e], method, group)) * _matmul(xe, up[e], method, group)).astype(F32)
        d = _matmul(a, down[e], *(down_method or (method, group)))
        out[tokens] += weights[tokens, slots][:, None].astype(np.float64) * d
    return out.astype(F32)


def expected_int8(x: Array, ids: Array, weights: Array, layer: dict[str, tuple[Array, Array]]) -> Array:
    """``expected`` for int8 weights given already quantized: ``layer[p] = (q [E, N, K], scale [E, N])``
    for p in gate, up, down (any int8 values, -128 included, as third-party quantizers write)."""

    matmul = int8_matmul
    x = np.asarray(x, dtype=F32)
    out = np.zeros((x.shape[0], layer["down"][0].shape[1]), dtype=np.float64)
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        xe = x[tokens]
        g, u, d = ((layer[p][0][e], layer[p][1][e]) for p in ("gate", "up", "down"))
        a = (silu(matmul(xe, *g)) * matmul(xe, *u)).astype(F32)
        out[tokens] += weights[tokens, slots][:, None].astype(np.float64) * matmul(a, *d)
    return out.astype(F32)


def gated(
    gate: Array, up: Array, swiglu_alpha: float = 1.0, swiglu_limit: float | None = None, up_offset: float = 0.0
) -> Array:
    """transformers' definitions, in float64: gate.clamp(max=limit), up.clamp(-limit, limit),
    gate * sigmoid(alpha * gate) * (up + offset)."""
    if swiglu_limit is not None:
        gate, up = np.minimum(gate, swiglu_limit), np.clip(up, -swiglu_limit, swiglu_limit)
    return gate / (1.0 + np.exp(-swiglu_alpha * gate)) * (up + up_offset)  # type: ignore[no-any-return]


def int8_activations_reference(
    x: Array,
    ids: Array,
    weights: Array,
    gate: Array,
    up: Array,
    down: Array,
    *,
    block: int | tuple[int, int],
    orders: tuple[Array, Array] | None = None,
    biases: tuple[Array, Array, Array] | None = None,
    activation: dict[str, Any] | None = None,
) -> Array:
    """The layer over given dense weights (float64, any values: a checkpoint's own dequantization)
    with each projection's input as int8-activation kernels take it, a scale per ``block`` values
    of K (gate/up's input, down's; one int: both; ``quantize_blocks``, the intermediate activation
    computed in float32 first), in each expert's input orders where given (``orders``: gate/up's
    [E, H], down's [E, I]; GPTQ's act-order: the blocks are of the inputs permuted so); optional
    per-expert biases (gate, up, down) and gated activation settings (``gated``)."""
    blocks = (block, block) if isinstance(block, int) else block

    def matmul(a: Array, w: Array, size: int) -> Array:
        return dequantize_blocks(a, size) @ w.astype(np.float64).T  # type: ignore[no-any-return]

    x = np.asarray(x, dtype=F32)
    out = np.zeros((x.shape[0], down.shape[1]), dtype=np.float64)
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        order = np.arange(x.shape[1]) if orders is None else orders[0][e]
        g, u = (
            matmul(x[tokens][:, order], gate[e][:, order], blocks[0]),
            matmul(x[tokens][:, order], up[e][:, order], blocks[0]),
        )
        if biases is not None:
            g, u = g + biases[0][e], u + biases[1][e]
        a = (gated(g, u, **(activation or {}))).astype(F32)
        inner = np.arange(a.shape[1]) if orders is None else orders[1][e]
        d = matmul(a[:, inner], down[e][:, inner], blocks[1]) + (biases[2][e] if biases is not None else 0.0)
        out[tokens] += weights[tokens, slots][:, None].astype(np.float64) * d
    return out.astype(F32)


def int8_layer_error(y: Array, reference: Array, bound: float = 1e-4) -> float:
    """``rel_err`` of a layer against ``int8_activations_reference``, forgiving the rare token whose
    intermediate activation, a hair from a rounding boundary, quantizes to the neighbouring int8
    step in float32 and not in float64 (one step of one value moves a token's output by about
    1e-3 of the largest): the largest error of the tokens but the worst T // 50 (none under 50
    tokens), and inf if any token is over 1e-2 (no wrong weight or scale hides in that)."""
    per_token = np.abs(np.asarray(y, np.float64) - reference).max(axis=-1) / np.abs(reference).max()
    if (per_token > 1e-2).any():
        return float("inf")
    kept = np.sort(per_token)[: len(per_token) - len(per_token) // 50]
    return float(kept.max(initial=0.0))


def float_reference(
    x: Array,
    ids: Array,
    weights: Array,
    gate: Array,
    up: Array,
    down: Array,
    *,
    bf16_experts: Container[int] = (),
) -> Array:
    """The float64 layer. For the experts in ``bf16_experts``, x and the intermediate activation
    are rounded to bfloat16 first, as kernels on bf16 dot products take them (weights exact)."""
    x64 = np.asarray(x, dtype=np.float64)
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t]):
            bf16 = e in bf16_experts
            xt = bf16_round(x[t]).astype(np.float64) if bf16 else x64[t]
            a = silu(gate[e].astype(np.float64) @ xt) * (up[e].astype(np.float64) @ xt)
            if bf16:
                a = bf16_round(a.astype(F32)).astype(np.float64)
            out[t] += float(weights[t, j]) * (down[e].astype(np.float64) @ a)
    return out


# ---- test inputs shared by the kernel tests ------------------------------------------------

SHAPES = [  # (E, k, H, I, T): H and I not multiples of 16 or 64, E=1, k=E, T=1 and T=1000
    (5, 2, 72, 50, 7),
    (1, 1, 40, 24, 3),
    (3, 3, 24, 40, 1),
    (4, 2, 56, 36, 1000),
    (3, 2, 100, 70, 90),  # >= 16 tokens per expert: the tile kernels' path, with a ragged tail
]


def make_layer(E: int, H: int, I: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    up = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    down = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    return gate, up, down


def routing(T: int, E: int, k: int, seed: int = 1) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]) if T else np.zeros((0, k), np.int64)
    weights = rng.random((T, k)).astype(np.float32)
    return ids.astype(np.int64), weights


def rel_err(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-12))
