"""The i-quants' float32 values from their portable layout (:mod:`ktforge.formats.quantize`), as
ggml-quants.c's ``dequantize_row_iq*`` define them, on the grids of :mod:`ktforge.formats.lattice`."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ktforge.formats import lattice

Array = np.ndarray[Any, Any]

# GGUF's i-quants: a block's bytes, its float16 d first (portable: ``weight`` the blocks less d,
# ``scale`` the d)
LATTICE_BLOCK_BYTES = {"iq2xxs": 66, "iq2xs": 74, "iq3xxs": 98, "iq1s": 50}


@functools.cache
def _grid(name: str) -> Array:
    return np.array(lattice.grid(name), dtype=np.float32)


def _bits(values: Array, shifts: Array, width: int) -> Array:
    """``values[..., None] >> shifts`` masked to ``width`` bits."""
    return (values[..., None] >> shifts) & ((1 << width) - 1)


def lattice_values(element: str, codes: Array, d: Array) -> Array:
    """An i-quant's float32 weights ``[..., N, Kp]`` from its blocks less d ``[..., N, S * (bytes - 2)]``
    and their d ``[..., N, S]`` (float16), as ggml-quants.c's dequantize_row_iq* define them."""
    blocks = codes.reshape(*codes.shape[:-1], -1, LATTICE_BLOCK_BYTES[element] - 2)  # [..., S, bytes]
    d32 = np.asarray(d).view(np.float16).astype(np.float32)[..., None, None]  # [..., S, 1, 1]
    lines = np.arange(4, dtype=np.uint32)
    if element == "iq1s":
        qs = blocks[..., :32].reshape(*blocks.shape[:-1], 8, 4).astype(np.uint32)  # [..., S, ib, line]
        qh = np.ascontiguousarray(blocks[..., 32:48]).view("<u2").astype(np.uint32)  # [..., S, ib]
        index = qs | (_bits(qh, 3 * lines, 3) << 8)
        scale = d32 * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)[..., None]
        shift = np.where(qh & 0x8000, np.float32(-0.125), np.float32(0.125))[..., None, None]
        values: Array = scale[..., None] * (_grid("iq1s")[index] + shift)  # [..., S, ib, line, 8]
        return values.reshape(*codes.shape[:-1], -1)
    if element == "iq2xs":
        q16 = np.ascontiguousarray(blocks[..., :64]).view("<u2").reshape(*blocks.shape[:-1], 8, 4).astype(np.uint32)
        index, s7 = q16 & 511, q16 >> 9
        sc = blocks[..., 64:72].astype(np.uint32)  # [..., S, ib]: lines 0-1 low nibble, 2-3 high
        ls = _bits(sc, np.array([0, 0, 4, 4], dtype=np.uint32), 4)
        grid = _grid("iq2xs")[index]
        factor = np.float32(0.25)
    else:
        per_ib = blocks[..., :64].reshape(*blocks.shape[:-1], 8, 8)  # [..., S, ib, 8 bytes]
        if element == "iq2xxs":
            index = per_ib[..., :4].astype(np.uint32)
            aux = np.ascontiguousarray(per_ib[..., 4:]).view("<u4")[..., 0]
            grid = _grid("iq2xxs")[index]
            factor = np.float32(0.25)
        else:  # iq3xxs: two indices a line, 4 values each
            index = per_ib.reshape(*per_ib.shape[:-1], 4, 2).astype(np.uint32)
            aux = np.ascontiguousarray(blocks[..., 64:96]).view("<u4")  # [..., S, ib]
            grid = _grid("iq3xxs")[index].reshape(*index.shape[:-1], 8)
            factor = np.float32(0.5)
        s7 = _bits(aux.astype(np.uint32), 7 * lines, 7)
        ls = np.repeat((aux.astype(np.uint32) >> 28)[..., None], 4, axis=-1)
    parity = np.zeros_like(s7)
    for bit in range(7):
        parity ^= (s7 >> bit) & 1
    signs = _bits(s7 | (parity << 7), np.arange(8, dtype=np.uint32), 1)  # [..., S, ib, line, 8]
    scale = d32 * (np.float32(0.5) + ls.astype(np.float32)) * factor  # as gguf-py: d * (0.5 + ls) * f
    signed: Array = scale[..., None] * grid * np.where(signs == 1, np.float32(-1), np.float32(1))
    return signed.reshape(*codes.shape[:-1], -1)
