"""compressed-tensors' packed 4-bit formats, one ``{name}_packed`` tensor a weight:

- ``pack-quantized`` INT4, as Kimi-K2-Thinking and llm-compressor's W4A16 schemes store it:
  ``_packed`` int32 ``[N, ceil(K / 8)]`` (value i of a row at bits 4i..4i+3 of its word i / 8,
  stored as q + 8), ``_scale`` ``[N, K / group]`` in the model's dtype, ``_shape`` ``[N, K]``, and
  with asymmetric schemes ``_zero_point``. Little-endian int32 words of 4-bit values are, byte for
  byte, int4's portable layout (two a byte, even k in the low nibble, q + 8).
- ``mxfp4-pack-quantized``: ``_packed`` uint8 ``[N, K / 2]``, two E2M1 codes a byte (even k low),
  ``_scale`` uint8 ``[N, K / 32]`` E8M0 codes: mxfp4's portable layout as it is.
- ``nvfp4-pack-quantized``: the same codes, ``_scale`` F8_E4M3 ``[N, K / 16]`` and
  ``_global_scale``: nvfp4's (checkpoints/nvfp4.py reads them).

The scheme is the ``quantization_config``'s: 4-bit ``int`` (or ``float``, MXFP4) weights of
strategy ``group`` (NVFP4's ``tensor_group``: groups and a tensor scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ktforge.files import shown

Array = np.ndarray[Any, Any]
PACKED, SCALE, SHAPE, ZERO_POINT = "_packed", "_scale", "_shape", "_zero_point"
SUFFIXES = (PACKED, SCALE, SHAPE, ZERO_POINT)


@dataclass(frozen=True)
class Scheme:
    """The weights' packed scheme: "int4", "mxfp4" or "nvfp4", the group size (0: per channel) and whether
    it has zero points."""

    method: str
    group: int
    symmetric: bool


LAYOUTS = {
    "pack-quantized": ("int", "int4"),
    "mxfp4-pack-quantized": ("float", "mxfp4"),
    "nvfp4-pack-quantized": ("float", "nvfp4"),
}


def scheme_of(quantization: dict[str, Any], where: str) -> Scheme | None:
    """The 4-bit weight scheme of a compressed-tensors ``pack-quantized`` or
    ``mxfp4-pack-quantized`` config, or None when the config is neither; ValueError for a scheme
    ktforge cannot read."""
    if quantization.get("quant_method") != "compressed-tensors":
        return None
    groups = quantization.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        weights = group.get("weights") if isinstance(group, dict) else None
        layout = group.get("format", quantization.get("format")) if isinstance(group, dict) else None
        if layout not in LAYOUTS or not isinstance(weights, dict):
            continue
        kind, method = LAYOUTS[layout]
        if weights.get("type") != kind or weights.get("num_bits") != 4:
            raise ValueError(
                f"{where}: {layout} weights of {weights.get('num_bits')}-bit {weights.get('type')}; "
                f"ktforge serves 4-bit {kind}"
            )
        strategy, size = weights.get("strategy"), weights.get("group_size")
        if strategy == "channel" and method == "int4":
            return Scheme(method, 0, bool(weights.get("symmetric", True)))
        grouped = strategy == "group" or (
            strategy == "tensor_group" and method == "nvfp4"
        )  # NVFP4's, with its tensor scale
        if not grouped or not isinstance(size, int) or isinstance(size, bool) or not 0 < size < 2**31:
            raise ValueError(
                f"{where}: {layout} strategy {shown(strategy)} with group_size {shown(size)}; expected group"
            )
        return Scheme(method, size, bool(weights.get("symmetric", True)))
    return None


def codes(packed: Array, N: int, K: int, group: int) -> Array:
    """int4's portable codes ``[N, ceil(K / group) * group / 2]`` from ``_packed``'s int32 words:
    the words' bytes, each nibble past K set to 8 (a zero)."""
    half = -(-K // group) * group // 2
    raw = np.ascontiguousarray(packed).view("<u1").reshape(N, -1)
    out = np.full((N, half), 0x88, np.uint8)
    whole = K // 2
    out[:, :whole] = raw[:, :whole]
    if K % 2:  # the last value's byte: its high nibble lies past K
        out[:, whole] = (raw[:, whole] & 0x0F) | 0x80
    return out


def zero_points(packed: Array, N: int, groups: int) -> Array:
    """The zero points ``[N, groups]`` (int8, in [-8, 7]) of ``_zero_point``'s int32
    ``[ceil(N / 8), groups]``: packed along N, 8 rows a word, stored as z + 8."""
    by_group = np.ascontiguousarray(np.asarray(packed).T).view("<u1").reshape(groups, -1)
    nibbles = np.stack([by_group & 0x0F, by_group >> 4], axis=-1).reshape(groups, -1)[:, :N]
    return np.ascontiguousarray(nibbles.T).astype(np.int8) - 8
