"""The 4-bit float releases' expert tensors, checked and read as stored.

MXFP4 (mxfp4's portable layout, :class:`~ktforge.formats.quantize.Mxfp4Groups`): gpt-oss's fused
``_blocks`` / ``_scales``, compressed-tensors' ``mxfp4-pack-quantized``, DeepSeek-V4-Flash's I8
codes with F8_E8M0 scales.

NVFP4 (nvfp4's, :class:`~ktforge.formats.quantize.Nvfp4Groups`):

- NVIDIA ModelOpt (``quant_algo: NVFP4``, in ``quantization_config`` or ``hf_quant_config.json``):
  ``weight`` uint8 ``[N, K / 2]`` (two E2M1 codes a byte, even k low), ``weight_scale`` F8_E4M3
  ``[N, K / 16]``, ``weight_scale_2`` F32, one value for the tensor: ``w = e2m1 * weight_scale *
  weight_scale_2`` (``input_scale`` is the activations', which ktforge quantizes itself).
- compressed-tensors' ``nvfp4-pack-quantized``: ``weight_packed`` and ``weight_scale`` as ModelOpt's
  ``weight`` and ``weight_scale``, and ``weight_global_scale``, ``1 / weight_scale_2`` (the library's
  ModelOpt converter inverts it): ``w = e2m1 * (weight_scale / weight_global_scale)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ktforge.files import member, read_json, shown
from ktforge.formats.quantize import Mxfp4Groups, Nvfp4Groups

Array = np.ndarray[Any, Any]
GROUP = 16
SCALE_2, GLOBAL_SCALE = "_scale_2", "_global_scale"  # beside ``weight``: ModelOpt's, compressed-tensors'


def is_modelopt_nvfp4(config: dict[str, Any], directory: Path) -> bool:
    """Whether a checkpoint is ModelOpt's NVFP4: its ``quantization_config``'s ``quant_algo``, or
    that of ``hf_quant_config.json`` (ModelOpt's own file) where the config has none."""
    quantization = config.get("quantization_config")
    algo = quantization.get("quant_algo") if isinstance(quantization, dict) else None
    if algo is None and (directory / "hf_quant_config.json").is_file():
        document = read_json(member(directory, "hf_quant_config.json", str(directory)), "ModelOpt's quant config")
        inner = document.get("quantization") if isinstance(document, dict) else None
        algo = inner.get("quant_algo") if isinstance(inner, dict) else None
    return algo == "NVFP4"


def nvfp4_groups(
    codes: Array, scale: Array, scale_dtype: str, tensor_scale: Array, N: int, K: int, where: str, *, inverse: bool
) -> Nvfp4Groups:
    """One projection's NVFP4 tensors, checked, as nvfp4 serves them: ``tensor_scale`` is
    ModelOpt's ``weight_scale_2`` (``inverse``: compressed-tensors' ``weight_global_scale``).
    ValueError naming what does not fit."""
    wanted = -(-K // GROUP)
    if codes.dtype != np.uint8 or codes.shape != (N, wanted * GROUP // 2):
        raise ValueError(
            f"{where} is {codes.dtype} {list(codes.shape)}; NVFP4 of [{N}, {K}] is uint8 {[N, wanted * GROUP // 2]}"
        )
    if scale_dtype != "F8_E4M3" or scale.shape != (N, wanted):
        raise ValueError(
            f"{where}: its weight_scale is {scale_dtype} {list(scale.shape)}; NVFP4 needs F8_E4M3 {[N, wanted]}"
        )
    bits = np.ascontiguousarray(scale).view(np.uint8)
    if ((bits & 0x7F) == 0x7F).any():
        raise ValueError(f"{where}: its weight_scale holds NaN")
    if (bits > 0x80).any():
        raise ValueError(f"{where}: its weight_scale holds negative scales (NVFP4's are unsigned)")
    tensor = np.asarray(tensor_scale, dtype=np.float64).reshape(-1)
    if tensor.size != 1 or not np.isfinite(tensor).all() or not tensor[0] > 0:
        name = "weight_global_scale" if inverse else "weight_scale_2"
        raise ValueError(f"{where}: its {name} must be one finite positive value, got {shown(tensor.tolist())}")
    value = np.float32(1 / tensor[0] if inverse else tensor[0])  # compressed-tensors' inverted once, in float64
    return Nvfp4Groups(np.ascontiguousarray(codes), bits & 0x7F, np.full(N, value, np.float32), K)


def mxfp4_fused(blocks: Array, scales: Array, N: int, K: int, projection: str, where: str) -> Mxfp4Groups:
    """One expert's rows of gpt-oss's fused tensors: ``_blocks`` uint8 [N', K / 32, 16] and
    ``_scales`` uint8 [N', K / 32] (E8M0), gate's and up's rows interleaved (N' = 2N)."""
    rows, groups = 2 * N if projection != "down" else N, -(-K // 32)
    if blocks.shape != (rows, groups, 16) or scales.shape != (rows, groups):
        raise ValueError(
            f"{where}: an expert's blocks {list(blocks.shape)} and scales {list(scales.shape)}; "
            f"config.json implies {[rows, groups, 16]} and {[rows, groups]}"
        )
    if projection != "down":  # gate's rows are the even ones, up's the odd
        start = 0 if projection == "gate" else 1
        blocks, scales = blocks[start::2], scales[start::2]
    return Mxfp4Groups(np.ascontiguousarray(blocks.reshape(N, groups * 16)), np.ascontiguousarray(scales), K)


def mxfp4_packed(codes: Array, scale: Array, scale_dtype: str, N: int, K: int, where: str) -> Mxfp4Groups:
    """compressed-tensors' ``mxfp4-pack-quantized`` (uint8 codes [N, K / 2], uint8 E8M0 [N, K / 32]),
    or DeepSeek-V4-Flash's FP4 experts (the codes I8, the scales F8_E8M0)."""
    groups = -(-K // 32)
    codes = np.ascontiguousarray(codes).view(np.uint8) if codes.dtype == np.int8 else codes
    if codes.dtype != np.uint8 or codes.shape != (N, groups * 16) or scale.shape != (N, groups):
        raise ValueError(
            f"{where}: {codes.dtype} {list(codes.shape)} with {scale_dtype} scales {list(scale.shape)}; MXFP4 of "
            f"[{N}, {K}] needs {[N, groups * 16]} codes and {[N, groups]} E8M0 scales"
        )
    return Mxfp4Groups(codes, np.ascontiguousarray(scale, dtype=np.uint8), K)
