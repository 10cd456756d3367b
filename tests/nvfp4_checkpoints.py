"""Tiny NVFP4 checkpoints, codes and scales from compressed-tensors' NVFP4 quantizer (its
``NVFP4A16`` preset: ``generate_gparam``, ``calculate_qparams`` and ``NVFP4PackedCompressor``), in
the layouts releases use, with the library's own dequantization.

- ``write_ct_nvfp4_checkpoint``: compressed-tensors' ``nvfp4-pack-quantized`` (``weight_packed``,
  ``weight_scale`` F8_E4M3, ``weight_global_scale``), as llm-compressor writes NVFP4 models.
- ``write_modelopt_nvfp4_checkpoint``: the same values in NVIDIA ModelOpt's layout (``weight``
  uint8, ``weight_scale``, ``weight_scale_2``, ``input_scale``; ``quant_algo: NVFP4``), as
  nvidia/*-NVFP4 releases store them. ModelOpt is not on this project's machines: its layout is the
  one compressed-tensors' own ``ModelOptNvfp4Converter`` reads (1 / weight_scale_2 is its global
  scale), and the test's values are that converter's output dequantized by compressed-tensors.
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

    return preset_name_to_scheme("NVFP4A16", ["Linear"])


def library_dense(state: dict[str, Any]) -> Array:
    """compressed-tensors' dequantization of its NVFP4 tensors (``weight_packed``, ``weight_scale``,
    ``weight_global_scale``), in float32 (its ``decompress`` rounds to bfloat16), float64."""
    import torch
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    packed = state["weight_packed"]
    codes = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
    dense = dequantize(
        x_q=codes,
        scale=state["weight_scale"].to(torch.float32),
        args=scheme().weights,
        global_scale=state["weight_global_scale"],
        dtype=torch.float32,
    )
    return dense.double().numpy()  # type: ignore[no-any-return]


def compress(w: Any) -> dict[str, Any]:
    """compressed-tensors' NVFP4 of ``w`` [N, K]: ``weight_packed`` uint8 [N, K / 2],
    ``weight_scale`` float8_e4m3fn [N, K / 16], ``weight_global_scale`` float32 [1]."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    s = scheme()
    w = w.float()
    global_scale = generate_gparam(w.min(), w.max())
    groups = w.reshape(w.shape[0], -1, 16)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), s.weights, global_scale=global_scale)
    state = {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale}
    return dict(NVFP4PackedCompressor.compress(state, s))


def _quantization_config() -> dict[str, Any]:
    from compressed_tensors.quantization import QuantizationConfig

    quantization = QuantizationConfig(config_groups={"group_0": scheme()}, format="nvfp4-pack-quantized")
    return json.loads(quantization.model_dump_json(exclude_none=True))  # type: ignore[no-any-return]


def write_ct_nvfp4_checkpoint(
    directory: Path, arch: str = "qwen3_moe", *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """One shard, layer 1 of 2; returns the library's dequantization {projection: [E, N, K]}."""

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        state = compress(w)
        return {name: state[name] for name in ("weight_packed", "weight_scale", "weight_global_scale")}, library_dense(
            state
        )

    kept = write_quantized_experts(directory, arch, (E, k, H, I), _quantization_config(), one, seed=seed)
    return {p: np.stack(d) for p, d in kept[1].items()}


MODELOPT_CONFIG = {
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "group_size": 16,
    "producer": {"name": "modelopt"},
}


def write_modelopt_nvfp4_checkpoint(
    directory: Path, arch: str = "qwen3_moe", *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """One shard, layer 1 of 2, in ModelOpt's layout; returns compressed-tensors' dequantization of
    what its ModelOpt converter makes of the tensors {projection: [E, N, K]}."""
    import torch
    from compressed_tensors.entrypoints.convert.converters import ModelOptNvfp4Converter

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        state = compress(w)
        modelopt = {
            "weight": state["weight_packed"],
            "weight_scale": state["weight_scale"],
            "weight_scale_2": (1 / state["weight_global_scale"]).reshape(()),
            "input_scale": torch.tensor(1.0),
        }
        named = {f"m.{name}": tensor.clone() for name, tensor in modelopt.items()}
        converted = ModelOptNvfp4Converter(targets=["re:.*"]).process(named)
        return modelopt, library_dense({name.removeprefix("m."): tensor for name, tensor in converted.items()})

    kept = write_quantized_experts(directory, arch, (E, k, H, I), MODELOPT_CONFIG, one, seed=seed)
    return {p: np.stack(d) for p, d in kept[1].items()}


def nvfp4_copy(model_dir: Path, out_dir: Path, dequantized_dir: Path) -> None:
    """A saved transformers model as an NVFP4 release of its routed experts (llm-compressor's
    ``nvfp4-pack-quantized``, the scheme targeting the experts only), the rest as it was; beside it
    the same model in bf16 by the library's own (float32) dequantization."""
    from .synthetic_checkpoints import write_release

    def quantize(name: str, tensor: Any) -> tuple[dict[str, Any], Array] | None:
        if ".mlp.experts." not in name or not name.endswith(".weight") or tensor.ndim != 2:
            return None
        state = compress(tensor)
        parts = {part: state[part] for part in ("weight_packed", "weight_scale", "weight_global_scale")}
        return parts, library_dense(state)

    config = _quantization_config()
    config["config_groups"]["group_0"]["targets"] = [r"re:.*mlp\.experts.*"]
    write_release(model_dir, out_dir, dequantized_dir, quantize, config)
