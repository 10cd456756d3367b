"""Tiny MXFP4 checkpoints, codes and scales from compressed-tensors' MXFP4 quantizer, with each
format's own library's dequantization.

- ``write_ct_mxfp4_checkpoint``: compressed-tensors' ``mxfp4-pack-quantized`` format, one
  ``weight_packed`` / ``weight_scale`` per expert, from the library's ``calculate_qparams`` (its
  MXFP4A16 preset) and ``MXFP4PackedCompressor``, which also dequantizes (``decompress``).
- ``write_deepseek_v4_flash``: DeepSeek-V4-Flash's experts as released: ``w1``/``w3``/``w2.weight``
  I8 [N, K / 2] (two E2M1 codes a byte) and ``.scale`` F8_E8M0 [N, K / 32], ``expert_dtype =
  "fp4"``, the codes compressed-tensors'. Its dequantization: transformers' own
  (``Fp8Dequantize``, the FP8 quantizer's path for these experts).
- ``gpt_oss_release``: a saved transformers gpt-oss model as OpenAI releases it: each layer's
  experts fused, ``gate_up_proj_blocks`` [E, 2I, H / 32, 16] and ``gate_up_proj_scales`` [E, 2I,
  H / 32] (gate and up rows interleaved), ``down_proj_blocks`` / ``_scales``, biases as they were,
  ``quantization_config = {"quant_method": "mxfp4"}``; the codes are compressed-tensors'. Its
  dequantization: transformers' own ``convert_moe_packed_tensors``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic_checkpoints import write_quantized_experts

Array = np.ndarray[Any, Any]


def scheme() -> Any:
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme("MXFP4A16", ["Linear"])


def compress(w: Any) -> tuple[Any, Any, Array]:
    """compressed-tensors' MXFP4 of ``w`` [N, K]: packed codes uint8 [N, K / 2], E8M0 scales uint8
    [N, K / 32], and its own dequantization (float64)."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    s = scheme()
    groups = w.reshape(w.shape[0], -1, 32)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), s.weights)
    compressed = dict(MXFP4PackedCompressor.compress({"weight": w, "weight_scale": scale}, s))
    dense = MXFP4PackedCompressor.decompress(dict(compressed), s)["weight"]
    return compressed["weight_packed"], compressed["weight_scale"], dense.double().numpy()


def write_ct_mxfp4_checkpoint(
    directory: Path, arch: str = "qwen3_moe", *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """One shard, layer 1 of 2; returns the library's dequantization {projection: [E, N, K]}."""
    import torch
    from compressed_tensors.quantization import QuantizationConfig

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        codes, scale, values = compress(w)
        return {"weight_packed": codes, "weight_scale": scale}, values

    quantization = QuantizationConfig(config_groups={"group_0": scheme()}, format="mxfp4-pack-quantized")
    config = json.loads(quantization.model_dump_json(exclude_none=True))
    kept = write_quantized_experts(directory, arch, (E, k, H, I), config, one, seed=seed, dtype=torch.bfloat16)
    return {p: np.stack(d) for p, d in kept[1].items()}


def gpt_oss_release(model_dir: Path, out_dir: Path) -> None:
    """The saved gpt-oss model's MXFP4 release (see the module's docstring)."""
    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            rows = tensor.transpose(1, 2).contiguous()  # transformers keeps [E, K, N]; the release [E, N, K]
            parts = [compress(rows[e]) for e in range(rows.shape[0])]
            N, K = rows.shape[1:]
            tensors[name + "_blocks"] = torch.stack([c.reshape(N, K // 32, 16) for c, _, _ in parts])
            tensors[name + "_scales"] = torch.stack([s for _, s, _ in parts])
        else:
            tensors[name] = tensor
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (out_dir / "config.json").write_text(json.dumps(config))
    for extra in model_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out_dir / extra.name)


def gpt_oss_dense(release: Path, layer: int) -> dict[str, Array]:
    """transformers' own dequantization of a release's layer, float64 {projection: [E, N, K]}."""
    import torch
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(str(release / "model.safetensors"))
    prefix = f"model.layers.{layer}.mlp.experts."
    out = {}
    for fused in ("gate_up_proj", "down_proj"):
        # [E, K, N] as transformers' experts hold it
        w = convert_moe_packed_tensors(
            tensors[prefix + fused + "_blocks"], tensors[prefix + fused + "_scales"], dtype=torch.float32
        )
        out[fused] = w.transpose(1, 2).double().numpy()
    return {"gate": out["gate_up_proj"][:, 0::2], "up": out["gate_up_proj"][:, 1::2], "down": out["down_proj"]}


def _deepseek_v4(
    directory: Path, expert_dtype: str, one: Any, sizes: tuple[int, int, int, int], seed: int
) -> dict[str, Array]:
    """A DeepSeek-V4 release's layer 1 (its FP8 quantization_config with ue8m0 scales and the
    experts' dtype), each expert's tensors from ``one``; the dense weights it returned."""
    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
        "expert_dtype": expert_dtype,
    }
    kept = write_quantized_experts(directory, "deepseek_v4", sizes, config, one, seed=seed)
    return {p: np.stack(d) for p, d in kept[1].items()}


def write_deepseek_v4_flash(
    directory: Path, *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """One shard, layer 1 of 2; returns transformers' dequantization {projection: [E, N, K]}."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    dequantize = Fp8Dequantize(None)

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        codes, scale, _ = compress(w.to(torch.bfloat16))
        packed, e8m0 = codes.view(torch.int8), scale.view(torch.float8_e8m0fnu)
        dense = dequantize._dequantize_one(packed, e8m0, output_dtype=torch.float32)
        return {"weight": packed, "scale": e8m0}, dense.double().numpy()

    return _deepseek_v4(directory, "fp4", one, (E, k, H, I), seed)


def write_deepseek_v4_base(
    directory: Path, *, E: int = 4, k: int = 2, H: int = 256, I: int = 128, seed: int = 0
) -> dict[str, Array]:
    """DeepSeek-V4-Flash-Base's FP8 experts: ``.weight`` F8_E4M3 and ``.scale`` per 128 x 128 block
    in F8_E8M0 (``scale_fmt = "ue8m0"``: a power of two, the least with max|w| / scale <= 448), by
    torch's float8 cast; transformers' Fp8Dequantize dequantizes them."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    dequantize = Fp8Dequantize(None)

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        N, K = w.shape
        blocks = w.reshape(N // 128, 128, K // 128, 128).abs().amax(dim=(1, 3))
        scale = torch.exp2(torch.ceil(torch.log2(blocks.clamp(min=1e-30) / 448.0)))
        q = (w / scale.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
        e8m0 = scale.to(torch.float8_e8m0fnu)
        dense = dequantize._dequantize_one(q, e8m0, output_dtype=torch.float32)
        return {"weight": q, "scale": e8m0}, dense.double().numpy()

    return _deepseek_v4(directory, "fp8", one, (E, k, H, I), seed)


def gpt_oss_dequantized(release: Path, out_dir: Path) -> None:
    """A gpt-oss MXFP4 release as bf16, by transformers' own dequantization
    (``convert_moe_packed_tensors``), its experts fused as transformers saves them: the same model in
    the values a bf16 engine runs."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out_dir.mkdir(parents=True, exist_ok=True)
    stored = load_file(str(release / "model.safetensors"))
    tensors = {}
    for name, tensor in stored.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            dense = convert_moe_packed_tensors(tensor, stored[base + "_scales"], dtype=torch.float32)
            tensors[base] = dense.to(torch.bfloat16).contiguous()  # [E, K, N], as transformers keeps it
        else:
            tensors[name] = tensor
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((release / "config.json").read_text())
    del config["quantization_config"]
    (out_dir / "config.json").write_text(json.dumps(config))
    for extra in release.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out_dir / extra.name)
