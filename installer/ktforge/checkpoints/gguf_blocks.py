"""ggml's blocks, repacked into ktforge's portable layouts (:mod:`ktforge.formats.quantize`)
value for value: every code and scale as the file holds it, only moved.

Each function takes a tensor's bytes as :class:`~ktforge.checkpoints.gguf_file.GgufFile` maps
them, uint8 ``[..., N, blocks * block bytes]`` (llama.cpp's ggml-common.h layouts), and returns
the parts of the format the type is served as (data/gguf_types.json).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ktforge import formats
from ktforge.checkpoints.gguf_file import ggml_types
from ktforge.formats.lattice_values import LATTICE_BLOCK_BYTES
from ktforge.formats.quantize import Quantized

Array = np.ndarray[Any, Any]


def _blocks(data: Array, block_bytes: int) -> Array:
    return data.reshape(*data.shape[:-1], data.shape[-1] // block_bytes, block_bytes)


def _pairs(values: Array) -> Array:
    """Codes in k order [..., K] -> two a byte, even k in the low nibble (int4's byte order)."""
    packed: Array = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    return packed


def _split_halves(qs: Array) -> Array:
    """ggml's 32-value nibble blocks (byte j: value j low, value j + 16 high) -> codes in k order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def bf16(data: Array) -> Quantized:
    import ml_dtypes

    return Quantized(np.ascontiguousarray(data).view(np.uint16).view(ml_dtypes.bfloat16), None)


def f16(data: Array) -> Quantized:
    return Quantized(np.ascontiguousarray(data).view("<f2"), None)


def f32(data: Array) -> Quantized:
    return Quantized(np.ascontiguousarray(data).view("<f4"), None)


def _legacy(data: Array, block_bytes: int, halves: int, five: bool) -> Quantized:
    """Q4_0, Q4_1, Q5_0, Q5_1 (float16 d, and m for _1; Q5's 4 bytes of high bits, bit j of the
    little-endian word for value j; 16 bytes of nibbles, byte j: value j low, j + 16 high) -> the
    codes in k order (two a byte in int4's order, or Q5's one a byte), d (and m) as they are."""
    blocks = _blocks(data, block_bytes)
    scale = np.ascontiguousarray(blocks[..., : 2 * halves]).view("<f2")
    codes = _split_halves(blocks[..., -16:])
    if five:
        high = np.ascontiguousarray(blocks[..., 2 * halves : 2 * halves + 4]).view("<u4")
        codes = codes | (((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4)
    codes = codes.reshape(*blocks.shape[:-2], -1)
    return Quantized(codes if five else _pairs(codes), scale if halves == 2 else scale[..., 0])


def q4_0(data: Array) -> Quantized:
    """Q4_0 (w = d * (q - 8)) -> q4_0."""
    return _legacy(data, 18, 1, False)


def q4_1(data: Array) -> Quantized:
    """Q4_1 (w = d * q + m) -> q4_1."""
    return _legacy(data, 20, 2, False)


def q5_0(data: Array) -> Quantized:
    """Q5_0 (w = d * (q - 16)) -> q5_0."""
    return _legacy(data, 22, 1, True)


def q5_1(data: Array) -> Quantized:
    """Q5_1 (w = d * q + m) -> q5_1."""
    return _legacy(data, 24, 2, True)


def q8_0(data: Array) -> Quantized:
    """Q8_0 (float16 d, 32 int8 codes: w = q * d) -> q8_0: the codes and d as they are."""
    blocks = _blocks(data, 34)
    d = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0]
    codes = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(*blocks.shape[:-2], -1)
    return Quantized(codes, d)


def mxfp4(data: Array) -> Quantized:
    """MXFP4 (an E8M0 byte, 16 bytes of E2M1 codes) -> mxfp4: the codes and the E8M0 byte."""
    blocks = _blocks(data, 17)
    codes = _split_halves(blocks[..., 1:]).reshape(*blocks.shape[:-2], -1)
    return Quantized(_pairs(codes), np.ascontiguousarray(blocks[..., 0]))


def nvfp4(data: Array) -> Quantized:
    """NVFP4 (per 64 values 4 UE4M3 bytes, then per 16 values 8 bytes: byte j value j low, j + 8
    high) -> nvfp4: the codes, the UE4M3 codes as ggml reads them (0x7F is 0; the sign bit, which
    llama.cpp's converter clears, is not read) and a tensor scale of 1 (the file's ``.scale``
    tensor, per expert, is GgufCheckpoint's)."""
    blocks = _blocks(data, 36)
    sub = blocks[..., 4:].reshape(*blocks.shape[:-1], 4, 8)
    codes = np.concatenate([sub & 0x0F, sub >> 4], axis=-1).reshape(*blocks.shape[:-2], -1)
    d = blocks[..., :4].reshape(*blocks.shape[:-2], -1)
    # 0xFF, which ggml reads as 480 (beyond UE4M3), stays 0x7F: the packer refuses it, naming it
    scale = np.where(d == 0x7F, 0, np.where(d == 0xFF, 0x7F, d & 0x7F)).astype(np.uint8)
    return Quantized(_pairs(codes), scale, global_scale=np.ones(data.shape[:-1], np.float32))


def _q4k_record(blocks: Array) -> Array:
    """Q4_K's and Q5_K's first 16 bytes (float16 d and dmin, 12 bytes of 6-bit scales and mins) ->
    q4_k's record: d, dmin, sc[8], m[8] (llama.cpp's get_scale_min_k4 unpacking of the 12 bytes)."""
    q = blocks[..., 4:16].astype(np.uint8)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0x0F) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    return np.ascontiguousarray(np.concatenate([blocks[..., 0:4], sc, m], axis=-1).astype(np.uint8))


def q4_k(data: Array) -> Quantized:
    """Q4_K (16 bytes of d, dmin, scales and mins, 128 bytes of codes) -> q4_k: the codes in k
    order, a record per super-block."""
    blocks = _blocks(data, 144)
    qs = blocks[..., 16:].reshape(*blocks.shape[:-1], 4, 32)  # 4 chunks: 32 low nibbles, then 32 high
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-2], -1)
    return Quantized(_pairs(codes), _q4k_record(blocks))


def q5_k(data: Array) -> Quantized:
    """Q5_K (Q4_K's 16 bytes, 32 bytes of high bits, 128 of low nibbles) -> q5_k: the codes in k
    order a byte each, Q4_K's record. Value 64 j + l (+ 32) of a super-block (j < 4, l < 32) is the
    low (high) nibble of byte 32 j + l of the nibbles, its bit 4 bit 2 j (+ 1) of byte l of the
    high bits (ggml-quants.c's dequantize_row_q5_K)."""
    blocks = _blocks(data, 176)
    qh = blocks[..., 16:48].reshape(*blocks.shape[:-1], 1, 1, 32)
    qs = blocks[..., 48:].reshape(*blocks.shape[:-1], 4, 1, 32)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-2)  # [j][nibble][l]
    shift = (2 * np.arange(4, dtype=np.uint8)[:, None] + np.arange(2, dtype=np.uint8)[None, :])[..., None]
    codes = (low | (((qh >> shift) & 1) << 4)).astype(np.uint8).reshape(*blocks.shape[:-2], -1)
    return Quantized(codes, _q4k_record(blocks))


def q6_k(data: Array) -> Quantized:
    """Q6_K (128 bytes of low nibbles, 64 of high two bits, 16 int8 scales, float16 d) -> q6_k: the
    codes in k order a byte each, a record per super-block: d, sc[16]. Value l + 32 t of each half
    of 128 (l < 32, t < 4) is the low (t < 2) or high nibble of byte l + 32 (t % 2) of the half's
    64 nibble bytes, its bits 4-5 bits 2t, 2t + 1 of byte l of its 32 high-bit bytes (ggml-quants.c's
    dequantize_row_q6_K)."""
    blocks = _blocks(data, 210)
    ql = blocks[..., :128].reshape(*blocks.shape[:-1], 2, 2, 32)  # [half][l + 32 j][l]
    qh = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)  # t = 0, 1 (low nibbles), 2, 3 (high)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    codes = (low | (high << 4)).astype(np.uint8).reshape(*blocks.shape[:-2], -1)
    record = np.concatenate([blocks[..., 208:210], blocks[..., 192:208]], axis=-1).astype(np.uint8)
    return Quantized(codes, np.ascontiguousarray(record))


def _two_bit_fields(planes: Array) -> Array:
    """ggml's 2-bit planes (``[..., chunks, 32]`` bytes; value 32 t + l of a chunk of 128 in bits 2t,
    2t + 1 of byte l) -> codes in k order ``[..., chunks * 128]``."""
    shift = (2 * np.arange(4, dtype=np.uint8))[:, None]
    fields: Array = (planes[..., None, :] >> shift) & 3
    return fields.reshape(*planes.shape[:-2], -1)


def q3_k(data: Array) -> Quantized:
    """Q3_K (32 bytes of hmask, 64 of 2-bit codes, 12 of 6-bit scales, float16 d) -> q3_k: the codes
    in k order a byte each, q = the two low bits + 4 where hmask's bit is set (value 32 t + l: bit
    t of hmask byte l), and q6_k's record: d, sc[16] = scale - 32 (scale j: nibble j // 8 of byte j
    % 8, its bits 4-5 bits 2 (j // 4) .. of byte 8 + j % 4: ggml-quants.c's dequantize_row_q3_K)."""
    blocks = _blocks(data, 110)
    low = _two_bit_fields(blocks[..., 32:96].reshape(*blocks.shape[:-1], 2, 32))
    hmask = blocks[..., 0:32]
    high = ((hmask[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(*blocks.shape[:-1], -1)
    codes = (low | (high << 2)).astype(np.uint8).reshape(*blocks.shape[:-2], -1)
    packed = blocks[..., 96:108]
    j = np.arange(16)
    scale = ((packed[..., j % 8] >> (4 * (j // 8)).astype(np.uint8)) & 0x0F) | (
        ((packed[..., 8 + j % 4] >> (2 * (j // 4)).astype(np.uint8)) & 3) << 4
    ).astype(np.uint8)
    sc = (scale.astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    record = np.concatenate([blocks[..., 108:110], sc], axis=-1).astype(np.uint8)
    return Quantized(codes, np.ascontiguousarray(record))


def q2_k(data: Array) -> Quantized:
    """Q2_K (16 bytes of 4-bit scales and mins, 64 of 2-bit codes, float16 d and dmin) -> q2_k: the
    codes in k order a byte each, a record a super-block: d, dmin, then the 16 bytes of scales and
    mins as they are (ggml-quants.c's dequantize_row_q2_K)."""
    blocks = _blocks(data, 84)
    codes = _two_bit_fields(blocks[..., 16:80].reshape(*blocks.shape[:-1], 2, 32)).astype(np.uint8)
    record = np.concatenate([blocks[..., 80:84], blocks[..., 0:16]], axis=-1).astype(np.uint8)
    return Quantized(codes.reshape(*blocks.shape[:-2], -1), np.ascontiguousarray(record))


def iq4_nl(data: Array) -> Quantized:
    """IQ4_NL (float16 d, 16 bytes of codes of the IQ4 grid: w = d * grid[q], Q4_0's byte order)
    -> iq4_nl: the codes in int4's byte order, d as it is."""
    blocks = _blocks(data, 18)
    d = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0]
    return Quantized(_pairs(_split_halves(blocks[..., 2:]).reshape(*blocks.shape[:-2], -1)), d)


def iq4_xs(data: Array) -> Quantized:
    """IQ4_XS (float16 d, 16 bits of scales' high bits, 4 bytes of their low nibbles, 128 bytes of
    codes, IQ4_NL's order per 32) -> iq4_xs: the codes in int4's byte order, a record a super-block:
    d and ls - 32 per 32 (ls: nibble ib % 2 of byte ib / 2, bits 2 ib, 2 ib + 1 of the 16 above it:
    ggml-quants.c's dequantize_row_iq4_xs)."""
    blocks = _blocks(data, 136)
    high = np.ascontiguousarray(blocks[..., 2:4]).view("<u2")  # [..., S, 1]
    low = blocks[..., 4:8]
    ib = np.arange(8)
    ls = ((low[..., ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & 0x0F) | (((high >> (2 * ib)) & 3) << 4).astype(
        np.uint8
    )
    record = np.concatenate([blocks[..., :2], (ls.astype(np.int16) - 32).astype(np.int8).view(np.uint8)], axis=-1)
    codes = _split_halves(blocks[..., 8:].reshape(*blocks.shape[:-1], 8, 16)).reshape(*blocks.shape[:-2], -1)
    return Quantized(_pairs(codes), np.ascontiguousarray(record.astype(np.uint8)))


def _lattice(block_bytes: int) -> Callable[[Array], Quantized]:
    """An i-quant (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S: float16 d, then the block's other bytes) ->
    its format: the blocks less d, as they are, and the d."""

    def repack(data: Array) -> Quantized:
        blocks = _blocks(data, block_bytes)
        d = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0]
        return Quantized(np.ascontiguousarray(blocks[..., 2:]).reshape(*blocks.shape[:-2], -1), d)

    return repack


# the format each served type repacks into (data/gguf_types.json's served_as) -> its repack
REPACK: dict[str, Callable[[Array], Quantized]] = {
    "BF16": bf16,
    "F16": f16,
    "F32": f32,
    "Q4_0": q4_0,
    "Q4_1": q4_1,
    "Q5_0": q5_0,
    "Q5_1": q5_1,
    "Q8_0": q8_0,
    "MXFP4": mxfp4,
    "NVFP4": nvfp4,
    "Q4_K": q4_k,
    "Q5_K": q5_k,
    "Q6_K": q6_k,
    "Q3_K": q3_k,
    "Q2_K": q2_k,
    "IQ4_NL": iq4_nl,
    "IQ4_XS": iq4_xs,
}
# the i-quants served: their blocks as the type table sizes them
REPACK |= {
    t.name: _lattice(t.block_bytes)
    for t in ggml_types().values()
    if t.served_as is not None and formats.by_name(t.served_as).element in LATTICE_BLOCK_BYTES
}
