"""FP8 checkpoints with block scales (DeepSeek-V3's, the Qwen3-*-FP8 releases') as they are.

The routed experts: vLLM's loader fills the layout its own FP8 MoE method declares (E4M3 codes
``w13_weight`` ``[E, 2I, H]`` and ``w2_weight`` ``[E, H, I]``, float32 ``*_weight_scale_inv`` per
block), sliced for this rank as it slices them for itself; after loading they become ktforge's
``fp8`` format, codes and scales unchanged, and vLLM's copy is freed. vLLM's own FP8 MoE kernels
need AMX; these run on any x86-64 level.

The linear layers (attention, dense MLPs) stay vLLM's; where vLLM has no CPU kernel for them
(its FP8 GEMMs need AMX), they are dequantized to bf16 at load, after one log line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod

from ktforge import formats
from ktforge.engines.vllm.method import KtforgeMoEMethod, declare, say_once, why_unsupported
from ktforge.formats.quantize import Fp8Blocks, Quantized

FP8 = torch.float8_e4m3fn


def why_not_experts(moe: Any, block: tuple[int, int]) -> str | None:
    """Why this rank's share of a layer's FP8 blocks cannot be served as they are (None: it can)."""
    why = why_unsupported(moe)
    if why is not None:
        return why
    rows, cols = block
    inter, hidden = moe.intermediate_size_per_partition, moe.hidden_dim
    if cols not in formats.by_name("fp8").group_sizes:
        return f"its blocks are {cols} values of K; ktforge's fp8 takes groups of {formats.by_name('fp8').group_sizes}"
    if hidden % cols or inter % cols or inter % rows:
        return f"this rank's experts ({hidden} x {inter}) are not whole {rows} x {cols} blocks"
    return None


class KtforgeFp8MoEMethod(KtforgeMoEMethod):
    """A block-scaled FP8 checkpoint's routed experts, served in their own values."""

    weight_scale_refine = None  # vLLM's loader reads this: the checkpoint's blocks, not a finer grid

    def __init__(self, moe: Any, block: tuple[int, int]) -> None:
        super().__init__(moe, "fp8", block[1])
        self.block = block

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        rows, cols = self.block
        inter = intermediate_size_per_partition
        layer.num_experts, layer.orig_dtype, layer.weight_block_size = num_experts, params_dtype, list(self.block)
        shapes = {
            "w13_weight": ((num_experts, 2 * inter, hidden_size), FP8),
            "w2_weight": ((num_experts, hidden_size, inter), FP8),
            "w13_weight_scale_inv": ((num_experts, 2 * -(-inter // rows), -(-hidden_size // cols)), torch.float32),
            "w2_weight_scale_inv": ((num_experts, -(-hidden_size // rows), -(-inter // cols)), torch.float32),
        }
        block = {"quant_method": FusedMoeWeightScaleSupported.BLOCK.value}  # how vLLM's loader slices block scales
        declare(layer, shapes, lambda name: extra_weight_attrs | (block if "scale" in name else {}))
        layer.w13_input_scale = layer.w2_input_scale = None

    def process_weights_after_loading(self, layer: Any) -> None:
        # every check ran when the method was chosen (why_not_experts): a failure here is an error
        self._pack(layer)

    def _pack(self, layer: Any) -> None:
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        s13, s2 = layer.w13_weight_scale_inv.data, layer.w2_weight_scale_inv.data
        experts, hidden, inter = w2.shape
        gate_blocks = s13.shape[1] // 2

        def projection(codes: torch.Tensor, scales: torch.Tensor) -> Quantized:
            parts = [
                Fp8Blocks(codes[e].view(torch.uint8).numpy(), scales[e].numpy(), self.block).per_row(self.block[1])
                for e in range(experts)
            ]
            per_row = [p.scale for p in parts if p.scale is not None]  # fp8 always has them
            return Quantized(np.stack([p.weight for p in parts]), np.stack(per_row))

        kernels = self.kernels(experts, hidden, inter, "fp8", self.block[1])
        kernels.load_quantized(
            projection(w13[:, :inter], s13[:, :gate_blocks]),
            projection(w13[:, inter:], s13[:, gate_blocks:]),
            projection(w2, s2),
        )
        for name in ("w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv"):
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        self._register(layer, kernels, (experts, hidden, inter))


class DequantizedLinearMethod(LinearMethodBase):  # type: ignore[misc]
    """vLLM's own method for a checkpoint's FP8 linear layer where vLLM has a CPU kernel for it;
    where it has none, the layer's block-scaled weights dequantized to bf16 at load."""

    def __init__(self, own: Any) -> None:
        self.own = own
        self.dense: UnquantizedLinearMethod | None = None

    def create_weights(self, layer: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.own.create_weights(layer, *args, **kwargs)
        except ValueError as error:  # vLLM found no kernel; its parameters are declared by then
            scale = getattr(layer, "weight_scale_inv", None)
            if getattr(layer, "weight", None) is None or scale is None or layer.weight_block_size is None:
                raise
            reason = str(error).strip().splitlines()[-1]
            say_once(
                "dequantized-linear",
                "ktforge: vLLM has no CPU kernel here for the checkpoint's FP8 linear layers (%s): "
                "they are dequantized to bf16 at load; the routed experts stay FP8 on ktforge",
                reason,
                warning=True,
            )
            self.dense = UnquantizedLinearMethod()

    def process_weights_after_loading(self, layer: Any) -> None:
        if self.dense is None:
            self.own.process_weights_after_loading(layer)
            return
        codes, scale = layer.weight.data, layer.weight_scale_inv.data
        blocks = Fp8Blocks(codes.view(torch.uint8).numpy(), scale.float().numpy(), tuple(layer.weight_block_size))
        dense = torch.from_numpy(blocks.to_float32()).to(layer.orig_dtype)
        del layer.weight_scale_inv
        layer.weight = torch.nn.Parameter(dense, requires_grad=False)
        self.dense.process_weights_after_loading(layer)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = (self.dense or self.own).apply(layer, x, bias)
        return out
