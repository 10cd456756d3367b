"""Tiny FP8 checkpoints as the real tools write them, with each tool's own dequantization.

- ``block``: DeepSeek-V3's and transformers' fine-grained FP8 (Qwen3-*-FP8, MiniMax-M2): torch's
  ``float8_e4m3fn`` cast of w / scale, with ``weight_scale_inv`` per 128 x 128 block and
  ``quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}``. Its
  dequantization: torch's float8 to float32, times the block's scale.
- ``ct-channel``, ``ct-block``, ``ct-tensor``: compressed-tensors' ``float-quantized`` format
  (GLM FP8 releases, llm-compressor's FP8 schemes): scales from the library's
  ``calculate_qparams`` and codes from its ``FloatQuantizationCompressor``, which also
  dequantizes (``decompress``); ``weight_scale`` per channel ``[N, 1]``, per 128 x 128 block, or
  one for the tensor; ``quantization_config`` from the library's ``QuantizationConfig``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic_checkpoints import write_quantized_experts, write_release

Array = np.ndarray[Any, Any]
STYLES = ("block", "ct-channel", "ct-block", "ct-tensor")


def _torch_block(w: Any) -> tuple[dict[str, Any], Array]:
    import torch

    N, K = w.shape
    gn, gk = -(-N // 128), -(-K // 128)
    padded = torch.zeros(gn * 128, gk * 128)
    padded[:N, :K] = w
    max_abs = padded.reshape(gn, 128, gk, 128).abs().amax(dim=(1, 3))
    scale = torch.where(max_abs > 0, max_abs / 448.0, torch.ones_like(max_abs))
    expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
    q = (w / expanded).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}, (q.to(torch.float64) * expanded.double()).numpy()


def _scheme(style: str) -> Any:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    strategy = style.removeprefix("ct-")
    extra = {"block_structure": [128, 128]} if strategy == "block" else {}
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, **extra)
    return QuantizationScheme(targets=["Linear"], weights=args)


def _compressed_tensors(w: Any, style: str, scheme: Any = None) -> tuple[dict[str, Any], Array]:
    import torch
    import torch.nn.functional as F
    from compressed_tensors.compressors import FloatQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = scheme or _scheme(style)
    N, K = w.shape
    if style == "ct-channel":
        low, high = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    elif style == "ct-block":
        gn, gk = -(-N // 128), -(-K // 128)
        blocks = F.pad(w, (0, gk * 128 - K, 0, gn * 128 - N)).reshape(gn, 128, gk, 128)
        low, high = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    else:
        low, high = w.amin().reshape(1), w.amax().reshape(1)
    scale, zero_point = calculate_qparams(low, high, scheme.weights)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zero_point}
    compressed = FloatQuantizationCompressor.compress(state, scheme)
    dense = FloatQuantizationCompressor.decompress(dict(compressed), scheme)["weight"]
    assert compressed["weight"].dtype == torch.float8_e4m3fn
    return dict(compressed), dense.to(torch.float64).numpy()


def quantization_config(style: str) -> dict[str, Any]:
    if style == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig(config_groups={"group_0": _scheme(style)}, format="float-quantized")
    return json.loads(config.model_dump_json(exclude_none=True))


def write_fp8_checkpoint(
    directory: Path,
    style: str,
    arch: str = "qwen3_moe",
    *,
    E: int = 4,
    k: int = 2,
    H: int = 256,
    I: int = 128,
    moe_layers: tuple[int, ...] = (1,),
    seed: int = 0,
) -> dict[int, tuple[Array, Array, Array]]:
    """Writes the checkpoint (one shard); returns {layer: (gate, up, down)} as the tool
    dequantizes them, float64."""

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        return _torch_block(w) if style == "block" else _compressed_tensors(w, style)

    kept = write_quantized_experts(
        directory, arch, (E, k, H, I), quantization_config(style), one, layers=moe_layers, seed=seed
    )
    return {layer: (np.stack(d["gate"]), np.stack(d["up"]), np.stack(d["down"])) for layer, d in kept.items()}


# what an FP8 release quantizes: the linear layers of attention and of the routed experts (the
# router, norms, embeddings and lm_head stay in their dtype)
_FP8_LINEARS = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".mlp.experts.")
_ROUTERS = (".mlp.gate.weight",)


def fp8_copy(model_dir: Path, out_dir: Path) -> None:
    """A saved transformers model as its fine-grained FP8 release (``block`` style): every linear
    weight of attention and of the experts quantized by torch's float8 cast with 128 x 128 block
    ``weight_scale_inv``, everything else as it was."""
    import shutil

    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    kept = ["lm_head"]  # the linear layers left in their dtype, named as the release's config does
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        if name.endswith(".weight") and tensor.ndim == 2 and any(part in name for part in _FP8_LINEARS):
            parts, _ = _torch_block(tensor.float())
            tensors[name], tensors[name + "_scale_inv"] = parts["weight"], parts["weight_scale_inv"]
        else:
            tensors[name] = tensor
            if name.endswith(_ROUTERS):
                kept.append(name.removesuffix(".weight"))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config("block") | {"modules_to_not_convert": kept}
    (out_dir / "config.json").write_text(json.dumps(config))
    for extra in model_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out_dir / extra.name)


def dequantized_copy(fp8_dir: Path, out_dir: Path) -> None:
    """An FP8 release (``block`` style, one shard) as bf16, by its own dequantization (float8 to
    float32 times the block's ``weight_scale_inv``): the same model in the values a bf16 engine runs."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    stored = load_file(str(fp8_dir / "model.safetensors"))
    tensors = {}
    for name, tensor in stored.items():
        if name.endswith("_scale_inv"):
            continue
        scale = stored.get(name + "_scale_inv")
        if scale is None:
            tensors[name] = tensor
            continue
        N, K = tensor.shape
        expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
        tensors[name] = (tensor.to(torch.float32) * expanded).to(torch.bfloat16)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8_dir / "config.json").read_text())
    del config["quantization_config"]
    (out_dir / "config.json").write_text(json.dumps(config))
    for extra in fp8_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out_dir / extra.name)


# what llm-compressor's FP8 recipes for MoE models leave in their dtype: the routers and lm_head
CT_RELEASE_IGNORE = ["lm_head", "re:.*mlp\\.gate$"]


def ct_fp8_release(model_dir: Path, out_dir: Path, dequantized_dir: Path, preset: str = "FP8_DYNAMIC") -> None:
    """A saved transformers model as llm-compressor's FP8 release of it (``float-quantized``, the
    library's ``preset`` scheme: FP8_DYNAMIC's scale per channel with dynamic per-token inputs, or
    FP8_BLOCK's 128 x 128 blocks) over every linear layer of attention and the experts; beside it
    the same release with its routed experts in bf16 by the library's own decompression (and
    listed in ``ignore``): what vLLM's own kernels run everywhere, its attention as released."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    style = "ct-" + str(getattr(scheme.weights.strategy, "value", scheme.weights.strategy))

    def quantize(name: str, tensor: Any) -> tuple[dict[str, Any], Array] | None:
        linear = name.endswith(".weight") and tensor.ndim == 2 and any(part in name for part in _FP8_LINEARS)
        if not linear:
            return None
        return _compressed_tensors(tensor.float(), style, scheme)

    def config(ignore: list[str]) -> dict[str, Any]:
        made = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized", ignore=ignore)
        return dict(json.loads(made.model_dump_json(exclude_none=True)))

    experts_in_bf16 = config([*CT_RELEASE_IGNORE, "re:.*mlp\\.experts\\..*"])
    kept = ("self_attn", experts_in_bf16)
    write_release(model_dir, out_dir, dequantized_dir, quantize, config(CT_RELEASE_IGNORE), kept)
