"""Tiny INT4 checkpoints as compressed-tensors writes them (``pack-quantized``: Kimi-K2-Thinking's
format, and llm-compressor's W4A16), with the library's own dequantization.

Scales come from the library's ``calculate_qparams`` per group of the weights' rows, codes and
packing from its ``PackedQuantizationCompressor``, the config from its ``QuantizationConfig``.
The dense weights are the library's ``unpack_from_int32`` and ``dequantize`` computed in float64
(its ``decompress`` rounds them to the weights' dtype, bfloat16, which is not what the file holds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic_checkpoints import write_quantized_experts, write_release

Array = np.ndarray[Any, Any]


def scheme(group: int, symmetric: bool = True) -> Any:
    """group 0: the channel strategy (a scale per output row)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    strategy = {"strategy": "channel"} if group == 0 else {"strategy": "group", "group_size": group}
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, **strategy)
    return QuantizationScheme(targets=["Linear"], weights=args)


def quantization_config(group: int, symmetric: bool = True) -> dict[str, Any]:
    from compressed_tensors.quantization import QuantizationConfig

    config = QuantizationConfig(config_groups={"group_0": scheme(group, symmetric)}, format="pack-quantized")
    return json.loads(config.model_dump_json(exclude_none=True))


def compress(w: Any, group: int, symmetric: bool = True) -> tuple[dict[str, Any], Array, Array]:
    """The library's tensors for ``w`` [N, K], its float64 dequantization, and the codes q [N, K]."""
    import torch
    import torch.nn.functional as F
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.utils import calculate_qparams

    s = scheme(group, symmetric)
    N, K = w.shape
    group = group or K
    groups = F.pad(w.float(), (0, -K % group)).reshape(N, -1, group)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), s.weights)
    scale = scale.to(w.dtype)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zero_point}
    compressed = dict(PackedQuantizationCompressor.compress(state, s))
    q = unpack_from_int32(compressed["weight_packed"], 4, torch.Size([N, K]))
    zero = None if symmetric else zero_point
    dense = dequantize(x_q=q, scale=compressed["weight_scale"].double(), zero_point=zero, args=s.weights)
    return compressed, dense.numpy(), q.numpy()


def write_int4_checkpoint(
    directory: Path,
    arch: str = "qwen3_moe",
    *,
    group: int = 32,
    E: int = 4,
    k: int = 2,
    H: int = 256,
    I: int = 128,
    moe_layers: tuple[int, ...] = (1,),
    seed: int = 0,
    scale_dtype: str = "bfloat16",
    symmetric: bool = True,
) -> dict[int, dict[str, tuple[Array, Array]]]:
    """Writes the checkpoint (one shard, experts in ``scale_dtype``, the scales' dtype); returns
    ``{layer: {projection: (dense float64 [E, N, K], codes [E, N, K])}}``."""
    import torch

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], tuple[Array, Array]]:
        parts, values, q = compress(w, group, symmetric)
        return parts, (values, q)

    kept = write_quantized_experts(
        directory,
        arch,
        (E, k, H, I),
        quantization_config(group, symmetric),
        one,
        layers=moe_layers,
        seed=seed,
        dtype=getattr(torch, scale_dtype),
    )
    return {
        layer: {p: (np.stack([v for v, _ in d]), np.stack([q for _, q in d])) for p, d in projections.items()}
        for layer, projections in kept.items()
    }


def int4_copy(model_dir: Path, out_dir: Path, group: int = 32) -> None:
    """A saved transformers model as its INT4 release (Kimi-K2-Thinking's way): every routed
    expert's weight compressed by compressed-tensors' packer (bf16 scales per ``group``), the
    rest as it was, the scheme targeting the experts only."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in load_file(str(model_dir / "model.safetensors")).items():
        if ".mlp.experts." in name and name.endswith(".weight") and tensor.ndim == 2:
            parts, _, _ = compress(tensor.to(torch.bfloat16), group)
            tensors.update({name.removesuffix("weight") + part: v.contiguous() for part, v in parts.items()})
        else:
            tensors[name] = tensor
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = quantization_config(group)
    config["quantization_config"]["config_groups"]["group_0"]["targets"] = [r"re:.*mlp\.experts.*"]
    (out_dir / "config.json").write_text(json.dumps(config))
    for extra in model_dir.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out_dir / extra.name)


# The layers a Kimi-K2-Thinking-style release leaves in bf16: all but the routed experts.
RELEASE_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.gate$"]


def int4_release(model_dir: Path, out_dir: Path, dequantized_dir: Path, group: int, symmetric: bool) -> None:
    """A saved transformers model as a compressed-tensors W4A16 release of its routed experts
    (``pack-quantized``, as Kimi-K2-Thinking's: attention, routers and lm_head in bf16, listed in
    ``ignore``), packed by the library; beside it the same model in bf16 by the library's own
    dequantization."""
    from compressed_tensors.quantization import QuantizationConfig

    def quantize(name: str, tensor: Any) -> tuple[dict[str, Any], Array] | None:
        if ".mlp.experts." not in name or not name.endswith(".weight"):
            return None
        parts, values, _ = compress(tensor, group, symmetric)
        return parts, values

    quantization = QuantizationConfig(
        config_groups={"group_0": scheme(group, symmetric)}, format="pack-quantized", ignore=RELEASE_IGNORE
    )
    write_release(
        model_dir, out_dir, dequantized_dir, quantize, json.loads(quantization.model_dump_json(exclude_none=True))
    )
