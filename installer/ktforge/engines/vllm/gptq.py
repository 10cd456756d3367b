"""GPTQ checkpoints (4-bit, groups along K, AutoGPTQ's and GPTQModel's layout) as they are.

The routed experts: vLLM's loader fills the layout its own GPTQ MoE method declares (``qweight``
int32 ``[E, K / 8, N]``, ``qzeros`` int32 ``[E, G, N / 8]``, ``scales`` ``[E, G, N]``, K first,
gate's columns then up's in ``w13_*``), sliced for this rank as it slices them for itself; after
loading each expert becomes ktforge's ``int4z``, codes, zero points and scales as the file has
them (:mod:`ktforge.checkpoints.gptq_awq` reads the layout), and vLLM's copy is freed. vLLM's own
GPTQ MoE kernels need AMX; these run on any x86-64 level. The scales are kept in float32, which
holds the file's float16 (or bfloat16) exactly, where vLLM would round them to the model's dtype.

The linear layers (attention, dense MLPs) stay on vLLM's own GPTQ kernels, which run on every CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from ktforge import formats
from ktforge.checkpoints import gptq_awq
from ktforge.engines.vllm.method import KtforgeMoEMethod, why_unsupported
from ktforge.formats.quantize import Int4Groups, Quantized
from ktforge.kernels.moe import MoE

METHOD = "int4z"  # zero points and float32 scales: GPTQ's values exactly
PACK = 8  # 4-bit values an int32 word


def why_not_experts(moe: Any, scheme: gptq_awq.Scheme) -> str | None:
    """Why this rank's share of a layer's GPTQ experts cannot be served as they are (None: it can)."""
    why = why_unsupported(moe)
    if why is not None:
        return why
    inter, hidden, group = moe.intermediate_size_per_partition, moe.hidden_dim, scheme.group
    if group not in formats.by_name(METHOD).group_sizes:
        return f"its groups are {group} values of K; ktforge's {METHOD} takes {formats.by_name(METHOD).group_sizes}"
    if hidden % group or inter % group or inter % PACK or hidden % PACK:
        return f"this rank's experts ({hidden} x {inter}) are not whole groups of {group} (and words of {PACK})"
    return None


class KtforgeGptqMoEMethod(KtforgeMoEMethod):
    """A GPTQ checkpoint's routed experts, served in their own values."""

    def __init__(self, moe: Any, scheme: gptq_awq.Scheme) -> None:
        super().__init__(moe, METHOD, scheme.group)
        self.scheme = scheme

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        inter, group = intermediate_size_per_partition, self.scheme.group
        shapes = {  # vLLM's GPTQ MoE layout, K first (is_transposed): how its loader slices them
            "w13_qweight": ((num_experts, hidden_size // PACK, 2 * inter), torch.int32),
            "w2_qweight": ((num_experts, inter // PACK, hidden_size), torch.int32),
            "w13_scales": ((num_experts, hidden_size // group, 2 * inter), torch.float32),
            "w2_scales": ((num_experts, inter // group, hidden_size), torch.float32),
            "w13_qzeros": ((num_experts, hidden_size // group, 2 * inter // PACK), torch.int32),
            "w2_qzeros": ((num_experts, inter // group, hidden_size // PACK), torch.int32),
        }
        attributes = dict(extra_weight_attrs) | {
            "quant_method": FusedMoeWeightScaleSupported.GROUP.value,
            "is_transposed": True,
        }
        for name, (shape, dtype) in shapes.items():
            parameter = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, parameter)
            set_weight_attrs(parameter, attributes)

    def process_weights_after_loading(self, layer: Any) -> None:
        # every check ran when the method was chosen (why_not_experts): a failure here is an error
        self._pack(layer)

    def _projection(self, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Quantized:
        """One projection of every expert ([E, K / 8, N] words) as int4z's portable layout."""
        experts, words, N = qweight.shape
        K = words * PACK
        parts = []
        for e in range(experts):
            tensors = {
                gptq_awq.QWEIGHT: qweight[e].numpy(),
                gptq_awq.QZEROS: qzeros[e].numpy(),
                gptq_awq.SCALES: scales[e].numpy(),
            }
            codes, scale, zero, _ = gptq_awq.unpack(self.scheme, tensors, N, K)
            parts.append(Int4Groups(codes, scale, self.scheme.group, K, zero.astype(np.int8) - 8).as_int4z())
        zeros = [p.zero for p in parts if p.zero is not None]  # int4z always has them
        return Quantized(
            np.stack([p.weight for p in parts]),
            np.stack([p.scale for p in parts if p.scale is not None]),
            np.stack(zeros),
        )

    def _pack(self, layer: Any) -> None:
        w13, w2 = layer.w13_qweight.data, layer.w2_qweight.data
        z13, z2 = layer.w13_qzeros.data, layer.w2_qzeros.data
        s13, s2 = layer.w13_scales.data, layer.w2_scales.data
        experts, hidden = w2.shape[0], w2.shape[2]
        inter = w13.shape[2] // 2
        for name, scale in (("w13_scales", s13), ("w2_scales", s2)):
            if not torch.isfinite(scale).all():
                raise ValueError(f"ktforge: {layer.layer_name}.{name} holds NaN or infinite scales")
        kernels = MoE(
            experts,
            self.moe.experts_per_token,
            hidden,
            inter,
            method=METHOD,
            group_size=self.scheme.group,
            threads=torch.get_num_threads(),
        )
        kernels.load_quantized(
            self._projection(w13[:, :, :inter], z13[:, :, : inter // PACK], s13[:, :, :inter]),
            self._projection(w13[:, :, inter:], z13[:, :, inter // PACK :], s13[:, :, inter:]),
            self._projection(w2, z2, s2),
        )
        for name in ("w13_qweight", "w2_qweight", "w13_scales", "w2_scales", "w13_qzeros", "w2_qzeros"):
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        layer.w13_weight, layer.w2_weight = layer.w13_qweight, layer.w2_qweight  # as vLLM's own GPTQ method names them
        self._register(layer, kernels, (experts, hidden, inter))
