"""Tiny synthetic Hugging Face checkpoints, written with the `safetensors` package.

Each names its tensors as the real architecture does (routed experts, plus the dense MLP,
shared experts, attention and embeddings that a converter must leave alone), is sharded
with an index like the real ones, and returns the float32 weights its experts stand for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

Array = np.ndarray[Any, Any]

NAMING = {
    "qwen3_moe": ("model.layers.{L}.mlp.experts.{E}.{P}.weight", ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": ("model.layers.{L}.mlp.experts.{E}.{P}.weight", ("gate_proj", "up_proj", "down_proj")),
    "mixtral": ("model.layers.{L}.block_sparse_moe.experts.{E}.{P}.weight", ("w1", "w3", "w2")),
    "deepseek_v4": ("layers.{L}.ffn.experts.{E}.{P}.weight", ("w1", "w3", "w2")),
}
DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _config(
    arch: str, E: int, k: int, H: int, I: int, layers: int, fp8_block: tuple[int, int] | None
) -> dict[str, Any]:
    base: dict[str, Any] = {"model_type": arch, "hidden_size": H, "num_hidden_layers": layers, "num_experts_per_tok": k}
    if arch == "qwen3_moe":
        base |= {"architectures": ["Qwen3MoeForCausalLM"], "moe_intermediate_size": I, "num_experts": E}
    elif arch == "deepseek_v3":
        base |= {
            "architectures": ["DeepseekV3ForCausalLM"],
            "moe_intermediate_size": I,
            "n_routed_experts": E,
            "first_k_dense_replace": 1,
            "n_shared_experts": 1,
        }
    elif arch == "deepseek_v4":
        base |= {
            "architectures": ["DeepseekV4ForCausalLM"],
            "moe_intermediate_size": I,
            "n_routed_experts": E,
            "swiglu_limit": 10.0,
        }
    else:
        base |= {"architectures": ["MixtralForCausalLM"], "intermediate_size": I, "num_local_experts": E}
    if fp8_block:
        base["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(fp8_block)}
    return base


def _fp8_blocks(w: Array, block: tuple[int, int]) -> tuple[Array, Array, Array]:
    """FP8 E4M3 weights with 128x128-style block scales (scale_inv), and what they stand for."""
    bn, bk = block
    N, K = w.shape
    gn, gk = -(-N // bn), -(-K // bk)
    padded = np.zeros((gn * bn, gk * bk), np.float32)
    padded[:N, :K] = w
    max_abs = np.abs(padded.reshape(gn, bn, gk, bk)).max(axis=(1, 3))
    scale = np.where(max_abs > 0, max_abs / 448.0, 1.0).astype(np.float32)
    expanded = np.repeat(np.repeat(scale, bn, axis=0), bk, axis=1)[:N, :K]
    q = (w / expanded).astype(ml_dtypes.float8_e4m3fn)
    return q, scale, q.astype(np.float32) * expanded


def write_checkpoint(
    directory: Path,
    arch: str = "qwen3_moe",
    *,
    dtype: str = "bf16",
    E: int = 4,
    k: int = 2,
    H: int = 40,
    I: int = 24,
    moe_layers: tuple[int, ...] = (1, 2),
    shards: int = 2,
    seed: int = 0,
    fp8_block: tuple[int, int] = (16, 16),
    drop: tuple[str, ...] = (),
    config_overrides: dict[str, Any] | None = None,
) -> dict[int, tuple[Array, Array, Array]]:
    """Writes the checkpoint; returns {layer: (gate [E,I,H], up [E,I,H], down [E,H,I])} in float32."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    layers = max(moe_layers) + 1
    config = _config(arch, E, k, H, I, layers, fp8_block if dtype == "fp8" else None) | (config_overrides or {})
    (directory / "config.json").write_text(json.dumps(config))
    tensors: dict[str, Array] = {"model.embed_tokens.weight": rng.standard_normal((16, H)).astype(np.float32)}
    pattern, names = NAMING[arch]
    truth: dict[int, tuple[Array, Array, Array]] = {}
    for layer in range(layers):
        tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = rng.standard_normal((H, H)).astype(np.float32)
        if layer not in moe_layers:  # a dense MLP, named like the experts' projections
            for p in names[:2]:
                tensors[f"model.layers.{layer}.mlp.{p}.weight"] = rng.standard_normal((I, H)).astype(np.float32)
            continue
        if arch == "deepseek_v3":  # a shared expert: not routed, left alone
            tensors[f"model.layers.{layer}.mlp.shared_experts.gate_proj.weight"] = np.ones((I, H), np.float32)
        projections: list[list[Array]] = [[], [], []]
        for e in range(E):
            for j, p in enumerate(names):
                shape = (H, I) if j == 2 else (I, H)
                w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
                name = pattern.format(L=layer, E=e, P=p)
                if dtype == "fp8":
                    q, scale, w = _fp8_blocks(w, fp8_block)
                    tensors[name], tensors[name + "_scale_inv"] = q, scale
                else:
                    tensors[name] = w.astype(DTYPES[dtype])
                    w = tensors[name].astype(np.float32)
                projections[j].append(w)
        truth[layer] = (np.stack(projections[0]), np.stack(projections[1]), np.stack(projections[2]))
    for name in drop:
        del tensors[name]
    names_sorted = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"))
        return truth
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names_sorted[i::shards]}
        save_file(part, str(directory / shard))
        weight_map |= dict.fromkeys(part, shard)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return truth


def expert_tensor(arch: str, layer: int, expert: int, projection: int) -> str:
    pattern, names = NAMING[arch]
    return pattern.format(L=layer, E=expert, P=names[projection])


def shard_of(directory: Path, tensor: str) -> Path:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return directory / json.loads(index.read_text())["weight_map"][tensor]
    return directory / "model.safetensors"


def write_quantized_experts(
    directory: Path,
    arch: str,
    sizes: tuple[int, int, int, int],
    quantization_config: dict[str, Any],
    quantize: Any,
    *,
    layers: tuple[int, ...] = (1,),
    seed: int = 0,
    dtype: Any = None,
) -> dict[int, dict[str, list[Any]]]:
    """A one-shard checkpoint of random experts as a quantizing tool writes them. ``sizes`` is (E,
    k, H, I); each projection's weight (normal / sqrt(K), torch, in ``dtype``) is given to
    ``quantize(w, expert, projection)``, which returns the tool's tensors, named by what follows
    the weight's name without ``weight`` (``weight_packed``, ``qweight``, ``weight_scale_inv``),
    and what the caller keeps of it; returns {layer: {projection: [that, one an expert]}}."""
    import torch
    from safetensors.torch import save_file as save_torch

    E, k, H, I = sizes
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    config = _config(arch, E, k, H, I, max(layers) + 1, None) | {"quantization_config": quantization_config}
    (directory / "config.json").write_text(json.dumps(config))
    pattern, names = NAMING[arch]
    tensors: dict[str, Any] = {"model.embed_tokens.weight": torch.randn(16, H, generator=generator)}
    kept: dict[int, dict[str, list[Any]]] = {}
    for layer in layers:
        kept[layer] = {p: [] for p in ("gate", "up", "down")}
        for e in range(E):
            for projection, p in zip(kept[layer], names, strict=True):
                shape = (H, I) if projection == "down" else (I, H)
                w = torch.randn(*shape, generator=generator) / shape[1] ** 0.5
                parts, result = quantize(w if dtype is None else w.to(dtype), e, projection)
                stem = pattern.format(L=layer, E=e, P=p).removesuffix("weight")
                tensors.update({stem + suffix: tensor.contiguous() for suffix, tensor in parts.items()})
                kept[layer][projection].append(result)
    save_torch(tensors, str(directory / "model.safetensors"))
    return kept


def write_release(
    model_dir: Path,
    out_dir: Path,
    dequantized_dir: Path,
    quantize: Any,
    quantization_config: dict[str, Any],
    kept_quantized: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """A saved transformers model (one ``model.safetensors``) as a quantized release, and beside it
    the same model in bf16 by the quantizing tool's own dequantization. ``quantize(name, tensor)``
    gives a tensor's stored parts ``{suffix: tensor}`` (after the name without ``weight``) and its
    dense float64 values, or None to keep the tensor as it is. ``kept_quantized``: (a part of the
    names whose tensors the bf16 copy keeps as released, that copy's quantization_config)."""
    import shutil

    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save_file as save_torch

    packed, dense = {}, {}
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        quantized = quantize(name, tensor)
        if quantized is None:
            packed[name] = dense[name] = tensor
            continue
        parts, values = quantized
        stored = {name.removesuffix("weight") + part: value.contiguous() for part, value in parts.items()}
        packed |= stored
        if kept_quantized is not None and kept_quantized[0] in name:
            dense |= stored
        else:
            dense[name] = torch.from_numpy(values).to(torch.bfloat16).contiguous()
    config = json.loads((model_dir / "config.json").read_text())
    for directory, tensors in ((out_dir, packed), (dequantized_dir, dense)):
        directory.mkdir(parents=True, exist_ok=True)
        save_torch(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        for extra in model_dir.iterdir():
            if extra.name not in ("config.json", "model.safetensors"):
                shutil.copy(extra, directory / extra.name)
    (out_dir / "config.json").write_text(json.dumps(config | {"quantization_config": quantization_config}))
    reference = {} if kept_quantized is None else {"quantization_config": kept_quantized[1]}
    (dequantized_dir / "config.json").write_text(json.dumps(config | reference))
