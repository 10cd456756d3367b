"""Tiny MXFP8 checkpoints, codes and scales from compressed-tensors' MXFP8 quantizer (its
``MXFP8A16`` preset: ``calculate_qparams`` and ``MXFP8QuantizationCompressor``), with the library's
own dequantization (``decompress``: E4M3 times a power of two, exact in its bfloat16).

- ``write_ct_mxfp8_checkpoint``: compressed-tensors' ``mxfp8-quantized`` (``weight`` F8_E4M3,
  ``weight_scale`` U8 E8M0 codes per 32 values), as llm-compressor writes MXFP8 models.
- ``write_modelopt_mxfp8_checkpoint``: the same tensors under ModelOpt's ``quant_algo: MXFP8``, the
  layout MiniMax-M3's MXFP8 release has (F8_E4M3 weights, U8 E8M0 scales per 32 columns).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic_checkpoints import write_quantized_experts

Array = np.ndarray[Any, Any]


def scheme() -> Any:
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme("MXFP8A16", ["Linear"])


def compress(w: Any) -> tuple[dict[str, Any], Array]:
    """compressed-tensors' MXFP8 of ``w`` [N, K]: ``weight`` float8_e4m3fn, ``weight_scale`` uint8
    [N, K / 32]; and the library's dequantization of them (float64)."""
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    s = scheme()
    groups = w.float().reshape(w.shape[0], -1, 32)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), s.weights)
    state = {"weight": w.float(), "weight_scale": scale, "weight_zero_point": zero}
    compressed = dict(MXFP8QuantizationCompressor.compress(state, s))
    dense = MXFP8QuantizationCompressor.decompress(dict(compressed), s)["weight"]
    return {"weight": compressed["weight"], "weight_scale": compressed["weight_scale"]}, dense.double().numpy()


def _write(directory: Path, arch: str, sizes: tuple[int, int, int, int], config: dict[str, Any], seed: int) -> Any:
    kept = write_quantized_experts(directory, arch, sizes, config, lambda w, e, p: compress(w), seed=seed)
    return {p: np.stack(d) for p, d in kept[1].items()}


def write_ct_mxfp8_checkpoint(
    directory: Path, arch: str = "qwen3_moe", *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """One shard, layer 1 of 2; returns the library's dequantization {projection: [E, N, K]}."""
    from compressed_tensors.quantization import QuantizationConfig

    quantization = QuantizationConfig(config_groups={"group_0": scheme()}, format="mxfp8-quantized")
    return _write(directory, arch, (E, k, H, I), json.loads(quantization.model_dump_json(exclude_none=True)), seed)  # type: ignore[no-any-return]


def write_modelopt_mxfp8_checkpoint(
    directory: Path, arch: str = "qwen3_moe", *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """The same, under ModelOpt's MXFP8 config (MiniMax-M3's release's tensors)."""
    config = {"quant_method": "modelopt", "quant_algo": "MXFP8", "group_size": 32, "producer": {"name": "modelopt"}}
    return _write(directory, arch, (E, k, H, I), config, seed)  # type: ignore[no-any-return]
