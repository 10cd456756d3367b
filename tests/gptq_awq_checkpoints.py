"""Tiny GPTQ and AWQ checkpoints, packed by the tools that define the formats, with their own
dequantization.

Each expert's weight is quantized on the asymmetric min/max grid (GPTQ's and AWQ's, float16
scales), its values replaced by their quantized ones (what both packers expect of the weight they
are given), then packed: GPTQ by AutoGPTQ's ``QuantLinear.pack`` (``qlinear_cuda``, with its
``g_idx``: act-order puts each input in the group of its rank in a random order, as GPTQ's
``desc_act`` does by the Hessian's diagonal), AWQ by AutoAWQ's ``WQLinear_GEMM.from_linear``. The
dense weights are the tools' own dequantization: AutoGPTQ's ``QuantLinear.forward`` on the
identity (its torch path on a CPU), AutoAWQ's ``dequantize_gemm`` in float64. Both tools are
imported without their packages' ``__init__``, which pulls in datasets and model code these
tests do not need.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .synthetic_checkpoints import write_quantized_experts, write_release

Array = np.ndarray[Any, Any]


_ROOTS: dict[str, Path] = {}


def _module_without_package_init(package: str, module: str) -> Any:
    """``package.module``, the packages on the way made bare namespaces (their ``__init__`` not run)."""
    if package not in _ROOTS:  # found before a namespace stands in for it
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
        _ROOTS[package] = Path(next(iter(spec.submodule_search_locations)))
    parts = [package, *module.split(".")]
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            namespace = types.ModuleType(name)
            namespace.__path__ = [str(_ROOTS[package].joinpath(*parts[1:i]))]
            sys.modules[name] = namespace
    return importlib.import_module(".".join(parts))


def _grid(w: Any, group: int, g_idx: Any = None, symmetric: bool = False) -> tuple[Any, Any, Any]:
    """(values on the grid [N, K], scales [N, G] float16-valued, zeros [N, G]); input k in group
    g_idx[k] (k // group by default). Asymmetric: min/max; symmetric: AutoGPTQ's ``sym``, the
    range +-max|w| over 15 steps with the zero at 8."""
    import torch

    N, K = w.shape
    order = torch.arange(K) if g_idx is None else torch.argsort(g_idx, stable=True)
    groups = w[:, order].reshape(N, K // group, group)  # each group's inputs side by side
    low = torch.minimum(groups.amin(-1), torch.zeros(1))
    high = torch.maximum(groups.amax(-1), torch.zeros(1))
    if symmetric:
        high = torch.maximum(high, -low)
        low = -high
    scale = ((high - low) / 15).clamp(min=1e-8).half().float()
    zero = torch.full_like(scale, 8.0) if symmetric else torch.clamp(torch.round(-low / scale), 0, 15)
    q = torch.clamp(torch.round(groups / scale[..., None]) + zero[..., None], 0, 15)
    values = torch.empty_like(w)
    values[:, order] = ((q - zero[..., None]) * scale[..., None]).reshape(N, K)
    return values, scale, zero


def act_order(K: int, group: int, seed: int) -> Any:
    """A g_idx as GPTQ's desc_act makes one: input k in the group of its rank in a permutation."""
    import torch

    rank = torch.empty(K, dtype=torch.int64)
    rank[torch.randperm(K, generator=torch.Generator().manual_seed(seed))] = torch.arange(K)
    return (rank // group).to(torch.int32)


def gptq(w: Any, group: int, g_idx: Any = None, symmetric: bool = False) -> tuple[dict[str, Any], Array]:
    import torch

    qlinear = _module_without_package_init("auto_gptq", "nn_modules.qlinear.qlinear_cuda")
    N, K = w.shape
    g_idx = torch.arange(K, dtype=torch.int32) // group if g_idx is None else g_idx
    values, scale, zero = _grid(w, group, g_idx, symmetric)
    linear = torch.nn.Linear(K, N, bias=False)
    linear.weight.data = values
    layer = qlinear.QuantLinear(4, group, K, N, bias=False, weight_dtype=torch.float32)
    layer.pack(linear, scale, zero, g_idx)
    with torch.no_grad():
        dense = layer(torch.eye(K)).T  # its own dequantization: x @ W^T of the identity
    tensors = {s: getattr(layer, s).clone() for s in ("qweight", "qzeros", "scales", "g_idx")}
    tensors["scales"] = tensors["scales"].half()
    return tensors, dense.double().numpy()


def awq(w: Any, group: int) -> tuple[dict[str, Any], Array]:
    import torch

    gemm = _module_without_package_init("awq", "modules.linear.gemm")
    packing = _module_without_package_init("awq", "utils.packing_utils")
    N, K = w.shape
    values, scale, zero = _grid(w, group)
    linear = torch.nn.Linear(K, N, bias=False)
    linear.weight.data = values
    layer = gemm.WQLinear_GEMM.from_linear(linear, 4, group, scales=scale.t().contiguous(), zeros=zero.t().contiguous())
    dense = packing.dequantize_gemm(layer.qweight, layer.qzeros, layer.scales.double(), 4, group).T
    return {s: getattr(layer, s).clone() for s in ("qweight", "qzeros", "scales")}, dense.numpy()


def quantization_config(method: str, group: int) -> dict[str, Any]:
    if method == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group,
            "desc_act": False,
            "sym": False,
            "checkpoint_format": "gptq",
        }
    return {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}


def write_gptq_awq_checkpoint(
    directory: Path,
    method: str,
    arch: str = "qwen3_moe",
    *,
    group: int = 128,
    E: int = 4,
    k: int = 2,
    H: int = 256,
    I: int = 128,
    seed: int = 0,
    desc_act: bool = False,
) -> dict[str, Array]:
    """One shard, layer 1 of 2; returns the tool's dequantization {projection: [E, N, K]}."""

    def one(w: Any, expert: int, projection: str) -> tuple[dict[str, Any], Array]:
        if method == "awq":
            parts, values = awq(w, group)
        else:  # gate and up take one input, so GPTQ gives them one Hessian and one order
            shared = 2 * expert if projection != "down" else 2 * expert + 1
            parts, values = gptq(w, group, act_order(w.shape[1], group, seed + shared) if desc_act else None)
        return parts, values  # qweight, qzeros, scales (g_idx), after the weight's name without "weight"

    config = quantization_config(method, group) | ({"desc_act": True} if desc_act else {})
    kept = write_quantized_experts(directory, arch, (E, k, H, I), config, one, seed=seed)
    return {p: np.stack(d) for p, d in kept[1].items()}


GPTQ_LINEARS = (".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".mlp.experts.")


def gptq_awq_release(
    model_dir: Path, out_dir: Path, dequantized_dir: Path, method: str, group: int = 128, desc_act: bool = False
) -> None:
    """A saved transformers model as a GPTQ release (4-bit, ``sym``, AutoGPTQ's v1 layout, as most
    GPTQ releases are) or an AWQ one (AutoAWQ's GEMM layout, with zero points): every linear
    layer of attention and of the experts packed by the tool, routers, norms, embeddings and
    lm_head as they were; beside it the same model in bf16 by the tool's own dequantization.
    ``desc_act``: GPTQ's act-order, with zero points (``sym`` false, as AutoGPTQ's default has it):
    the layers that take one input (q, k and v; an expert's gate and up) one order."""

    def quantize(name: str, tensor: Any) -> tuple[dict[str, Any], Array] | None:
        if not (name.endswith(".weight") and tensor.ndim == 2 and any(part in name for part in GPTQ_LINEARS)):
            return None
        if method == "awq":
            return awq(tensor.float(), group)
        if not desc_act:
            return gptq(tensor.float(), group, symmetric=True)
        one_input = name.replace("q_proj", "qkv").replace("k_proj", "qkv").replace("v_proj", "qkv")
        one_input = one_input.replace("gate_proj", "gate_up").replace("up_proj", "gate_up")
        g_idx = act_order(tensor.shape[1], group, seed=zlib.crc32(one_input.encode()))
        return gptq(tensor.float(), group, g_idx)

    scheme = quantization_config(method, group)
    if method == "gptq":
        scheme |= {"desc_act": True} if desc_act else {"sym": True}
    write_release(model_dir, out_dir, dequantized_dir, quantize, scheme)
