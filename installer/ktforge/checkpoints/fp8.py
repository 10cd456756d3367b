"""FP8 E4M3 checkpoints' scales: the block size a ``quantization_config`` states, and a weight's
scales read as fp8 serves them (:class:`~ktforge.formats.quantize.Fp8Blocks`): DeepSeek-V3's and
transformers' ``weight_scale_inv`` per block, compressed-tensors' per channel, block or tensor,
DeepSeek-V4's E8M0 ``.scale`` per 128 x 128 block; MXFP8's E8M0 code per row and 32 values."""

from __future__ import annotations

from typing import Any

import numpy as np

from ktforge.files import shown
from ktforge.formats.quantize import Fp8Blocks, Mxfp8Groups

Array = np.ndarray[Any, Any]


def block_of(quantization: Any, where: str) -> tuple[int, int]:
    """The FP8 block size, checked: DeepSeek-V3's quantization_config.weight_block_size, or
    compressed-tensors' block_structure of its weights (channel and tensor scales are told by
    their shapes); 128 x 128 without a config. ValueError for anything else."""
    if quantization is None:
        return (128, 128)
    if not isinstance(quantization, dict):
        raise ValueError(f"{where}: quantization_config must be an object, got {shown(quantization)}")
    groups = quantization.get("config_groups")
    groups = groups.values() if isinstance(groups, dict) else ()
    weights = [g.get("weights") for g in groups if isinstance(g, dict)]
    structures = [w["block_structure"] for w in weights if isinstance(w, dict) and w.get("block_structure")]
    block = quantization.get("weight_block_size", structures[0] if structures else [128, 128])
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b < 2**31 for b in block)
    ):
        raise ValueError(
            f"{where}: quantization_config.weight_block_size must be two positive integers below 2^31, "
            f"got {str(block)[:80]}"
        )
    return (block[0], block[1])


def blocks(w: Array, scale: Array, scale_dtype: str, block: tuple[int, int], where: str) -> Fp8Blocks:
    """FP8 weights [N, K] with their scales (``where``: the scale tensor, for messages): one per
    output channel ([N, 1]), one for the tensor, or one per ``block``; F8_E8M0 scales (DeepSeek-V4's
    ue8m0) are 2^(e - 127). ValueError where the shape fits none, or a scale is not finite."""
    if scale_dtype == "F8_E8M0":
        scale = np.ldexp(np.float32(1), scale.astype(np.int32) - 127).astype(np.float32)
    (bn, bk), (N, K) = block, w.shape
    if scale.shape == (N, 1):  # one scale per output channel
        bn, bk = 1, K
    elif scale.size == 1:  # one for the tensor
        bn, bk, scale = N, K, scale.reshape(1, 1)
    shape = (-(-N // bn), -(-K // bk))
    if scale.shape != shape:
        raise ValueError(f"{where} has shape {list(scale.shape)}; {bn}x{bk} blocks of [{N}, {K}] need {list(shape)}")
    s = np.ascontiguousarray(scale, dtype=np.float32)
    if not np.isfinite(s).all():
        raise ValueError(f"{where} contains NaN or infinite values")
    return Fp8Blocks(w.view(np.uint8), s, (bn, bk))


def microscaled(w: Array, e8m0: Array, where: str, scale_name: str) -> Mxfp8Groups:
    """MXFP8 weights [N, K] (E4M3) with their E8M0 codes [N, ceil(K / 32)], checked: no NaN code,
    no scale past 2^63 (the largest the kernels take) or 255 (NaN)."""
    codes, scale = np.ascontiguousarray(w).view(np.uint8), np.ascontiguousarray(e8m0).view(np.uint8)
    if ((codes & 0x7F) == 0x7F).any():
        raise ValueError(f"{where} holds a NaN code")
    if (scale > 190).any():
        raise ValueError(f"{where}: {scale_name} holds E8M0 code {int(scale.max())}: NaN or beyond 2^63")
    return Mxfp8Groups(codes, scale, codes.shape[1])
