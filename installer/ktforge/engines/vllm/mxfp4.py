"""gpt-oss's MXFP4 release (``quant_method: mxfp4``) as it is: the routed experts' E2M1 codes and
E8M0 scales, with their biases and gpt-oss's activation, on ktforge's ``mxfp4`` kernels.

vLLM's gpt-oss loader reads the release's fused tensors itself and hands each rank its share
(``gate_up_proj_blocks`` viewed as ``[E, 2I, H / 2]``, gate and up rows interleaved, ``down_proj_blocks``
as ``[E, H, I / 2]``, the scales ``[E, N, K / 32]``, the biases, down's on rank 0 only) to each
parameter's ``weight_loader``; these parameters take them whole. After loading the gate rows
(even) and up rows (odd) become ktforge's gate and up, codes and scales unchanged, and vLLM's copy
is freed. Attention, router and embeddings are bf16 in the release and stay vLLM's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ktforge.engines.vllm.method import KtforgeMoEMethod, declare, why_unsupported
from ktforge.formats.quantize import Mxfp4Groups, Quantized

BLOCK = 32  # values an E8M0 scale
ACTIVATIONS = ("swigluoai",)  # gpt-oss's, gate and up interleaved in w13


def why_not_experts(moe: Any) -> str | None:
    """Why this rank's share of a gpt-oss MXFP4 layer cannot be served as it is (None: it can)."""
    why = why_unsupported(moe, ACTIVATIONS, biases=True)
    if why is not None:
        return why
    inter, hidden = moe.intermediate_size_per_partition, moe.hidden_dim
    if hidden % BLOCK or inter % BLOCK:
        return f"this rank's experts ({hidden} x {inter}) are not whole blocks of {BLOCK}"
    return None


def _take_whole(param: torch.Tensor, loaded: torch.Tensor, *_: Any, **__: Any) -> None:
    """vLLM's gpt-oss loader has sliced ``loaded`` for this rank already: it fills the parameter."""
    if tuple(loaded.shape) != tuple(param.shape):
        raise ValueError(f"ktforge: a gpt-oss expert tensor of shape {tuple(loaded.shape)} for {tuple(param.shape)}")
    param.data.copy_(loaded)


class KtforgeMxfp4MoEMethod(KtforgeMoEMethod):
    """gpt-oss's MXFP4 routed experts, served in their own values."""

    def __init__(self, moe: Any) -> None:
        super().__init__(moe, "mxfp4", BLOCK)
        self.why_not = why_not_experts(moe)  # None: chosen only where it holds (not the float method's check)

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        inter = intermediate_size_per_partition
        shapes = {
            "w13_weight": ((num_experts, 2 * inter, hidden_size // 2), torch.uint8),
            "w13_weight_scale": ((num_experts, 2 * inter, hidden_size // BLOCK), torch.uint8),
            "w13_bias": ((num_experts, 2 * inter), torch.float32),
            "w2_weight": ((num_experts, hidden_size, inter // 2), torch.uint8),
            "w2_weight_scale": ((num_experts, hidden_size, inter // BLOCK), torch.uint8),
            "w2_bias": ((num_experts, hidden_size), torch.float32),
        }
        declare(layer, shapes, lambda _: extra_weight_attrs | {"weight_loader": _take_whole})

    def process_weights_after_loading(self, layer: Any) -> None:
        # every check ran when the method was chosen (why_not_experts): a failure here is an error
        self._pack(layer)

    def _pack(self, layer: Any) -> None:
        w13, s13 = layer.w13_weight.data, layer.w13_weight_scale.data
        w2, s2 = layer.w2_weight.data, layer.w2_weight_scale.data
        experts, hidden, inter = w2.shape[0], w2.shape[1], w13.shape[1] // 2

        def projection(codes: torch.Tensor, scales: torch.Tensor, K: int) -> Quantized:
            parts = [Mxfp4Groups(codes[e].numpy(), scales[e].numpy(), K).as_mxfp4() for e in range(experts)]
            return Quantized(
                np.stack([p.weight for p in parts]), np.stack([p.scale for p in parts if p.scale is not None])
            )

        kernels = self.kernels(experts, hidden, inter, "mxfp4", BLOCK)
        kernels.load_quantized(  # gate's rows are w13's even ones, up's the odd
            projection(w13[:, 0::2].contiguous(), s13[:, 0::2].contiguous(), hidden),
            projection(w13[:, 1::2].contiguous(), s13[:, 1::2].contiguous(), hidden),
            projection(w2, s2, inter),
        )
        bias13 = layer.w13_bias.data
        kernels.load_biases(bias13[:, 0::2].numpy(), bias13[:, 1::2].numpy(), layer.w2_bias.data.numpy())
        for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias"):
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        self._register(layer, kernels, (experts, hidden, inter))
