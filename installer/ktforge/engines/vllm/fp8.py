"""FP8 checkpoints as they are: block-scaled (DeepSeek-V3's, the Qwen3-*-FP8 releases') and
compressed-tensors' ``float-quantized`` (llm-compressor's FP8 schemes: a scale per channel, per
block or per tensor).

The routed experts: vLLM's loader fills the layout its own FP8 MoE method declares (E4M3 codes
``w13_weight`` ``[E, 2I, H]`` and ``w2_weight`` ``[E, H, I]``, float32 scales), sliced for this
rank as it slices them for itself; after loading they become ktforge's ``fp8`` format, codes and
scales unchanged, and vLLM's copy is freed. vLLM's own FP8 MoE kernels need AMX; these run on any
x86-64 level. Static FP8 input scales are read and not used: ktforge's fp8 kernels take the
activations exactly.

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
from ktforge.engines.vllm.method import KtforgeMoEMethod, declare, group_for, say_once, why_unsupported
from ktforge.formats.quantize import Fp8Blocks, Quantized

FP8 = torch.float8_e4m3fn
STRATEGIES = ("block", "channel", "tensor")  # compressed-tensors' FP8 weight scales ktforge reads


def why_not_experts(moe: Any, block: tuple[int, int] | None) -> str | None:
    """Why this rank's share of a layer's FP8 experts cannot be served as they are (None: it
    can); ``block`` None: a scale per channel or per tensor, which any of fp8's groups holds."""
    why = why_unsupported(moe)
    if why is not None:
        return why
    inter, hidden = moe.intermediate_size_per_partition, moe.hidden_dim
    sizes = formats.by_name("fp8").group_sizes
    if block is None:
        if not any(hidden % size == 0 and inter % size == 0 for size in sizes):
            return f"this rank's experts ({hidden} x {inter}) are not whole groups of any of {sizes} values"
        return None
    rows, cols = block
    if cols not in sizes:
        return f"its blocks are {cols} values of K; ktforge's fp8 takes groups of {sizes}"
    if hidden % cols or inter % cols or inter % rows:
        return f"this rank's experts ({hidden} x {inter}) are not whole {rows} x {cols} blocks"
    return None


class KtforgeFp8MoEMethod(KtforgeMoEMethod):
    """An FP8 checkpoint's routed experts with block scales (``weight_scale_inv``), served in
    their own values."""

    weight_scale_refine = None  # vLLM's loader reads this: the checkpoint's blocks, not a finer grid
    scale_name = "weight_scale_inv"
    strategy = "block"

    def __init__(self, moe: Any, block: tuple[int, int] | None, static_inputs: bool = False) -> None:
        super().__init__(moe, "fp8", block[1] if block else None)
        self.block, self.static_inputs = block, static_inputs

    def scale_shapes(self, experts: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
        """The scales' shapes in vLLM's layout of this strategy."""
        if self.strategy == "tensor":  # one a projection: gate's and up's apart
            return {"w13": (experts, 2), "w2": (experts,)}
        if self.strategy == "channel":
            return {"w13": (experts, 2 * inter, 1), "w2": (experts, hidden, 1)}
        assert self.block is not None
        rows, cols = self.block
        return {
            "w13": (experts, 2 * -(-inter // rows), -(-hidden // cols)),
            "w2": (experts, -(-hidden // rows), -(-inter // cols)),
        }

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
        layer.num_experts, layer.orig_dtype = num_experts, params_dtype
        layer.weight_block_size = list(self.block) if self.strategy == "block" and self.block else None
        scales = self.scale_shapes(num_experts, hidden_size, inter)
        shapes = {
            "w13_weight": ((num_experts, 2 * inter, hidden_size), FP8),
            "w2_weight": ((num_experts, hidden_size, inter), FP8),
            f"w13_{self.scale_name}": (scales["w13"], torch.float32),
            f"w2_{self.scale_name}": (scales["w2"], torch.float32),
        }
        if self.static_inputs:  # read, as the checkpoint holds them, and not used
            shapes |= dict.fromkeys(("w13_input_scale", "w2_input_scale"), ((num_experts,), torch.float32))
        else:
            layer.w13_input_scale = layer.w2_input_scale = None
        how = {"quant_method": getattr(FusedMoeWeightScaleSupported, self.strategy.upper()).value}
        declare(layer, shapes, lambda name: extra_weight_attrs | (how if "scale" in name else {}))

    def process_weights_after_loading(self, layer: Any) -> None:
        # every check ran when the method was chosen (why_not_experts): a failure here is an error
        self._pack(layer)

    def _blocks(self, codes: torch.Tensor, scale: torch.Tensor) -> Fp8Blocks:
        """One expert's projection ``[N, K]`` with its scales as vLLM holds them for this strategy."""
        N, K = codes.shape
        raw = codes.view(torch.uint8).numpy()
        if self.strategy == "tensor":
            return Fp8Blocks(raw, scale.reshape(1, 1).numpy(), (N, K))
        if self.strategy == "channel":
            return Fp8Blocks(raw, scale.reshape(N, 1).numpy(), (1, K))
        assert self.block is not None
        return Fp8Blocks(raw, scale.numpy(), self.block)

    def _pack(self, layer: Any) -> None:
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        s13, s2 = getattr(layer, f"w13_{self.scale_name}").data, getattr(layer, f"w2_{self.scale_name}").data
        experts, hidden, inter = w2.shape
        group = self.kt_group = group_for("fp8", self.kt_group, hidden, inter)
        gate_scales = s13.shape[1] // 2  # of gate's rows (tensor: gate's one scale)

        def projection(codes: torch.Tensor, scales: torch.Tensor) -> Quantized:
            parts = [self._blocks(codes[e], scales[e]).per_row(group) for e in range(experts)]
            per_row = [p.scale for p in parts if p.scale is not None]  # fp8 always has them
            return Quantized(np.stack([p.weight for p in parts]), np.stack(per_row))

        kernels = self.kernels(experts, hidden, inter, "fp8", group)
        kernels.load_quantized(
            projection(w13[:, :inter], s13[:, :gate_scales]),
            projection(w13[:, inter:], s13[:, gate_scales:]),
            projection(w2, s2),
        )
        for name in ("w13_weight", "w2_weight", f"w13_{self.scale_name}", f"w2_{self.scale_name}"):
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        self._register(layer, kernels, (experts, hidden, inter))


class KtforgeCompressedFp8MoEMethod(KtforgeFp8MoEMethod):
    """compressed-tensors' FP8 experts (``weight_scale`` per block, channel or tensor)."""

    scale_name = "weight_scale"

    def __init__(self, moe: Any, strategy: str, block: tuple[int, int] | None, static_inputs: bool) -> None:
        super().__init__(moe, block if strategy == "block" else None, static_inputs)
        self.strategy = strategy


class DequantizedLinearMethod(LinearMethodBase):  # type: ignore[misc]
    """vLLM's own method for a checkpoint's FP8 linear layer where vLLM has a CPU kernel for it;
    where it has none, the layer's FP8 weights dequantized to bf16 at load (block scales as
    ``weight_scale_inv``; compressed-tensors' ``weight_scale`` per block or channel)."""

    def __init__(self, own: Any) -> None:
        self.own = own
        self.dense: UnquantizedLinearMethod | None = None

    def create_weights(self, layer: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.own.create_weights(layer, *args, **kwargs)
        except ValueError as error:  # vLLM found no kernel; its parameters are declared by then
            if getattr(layer, "weight", None) is None or _scale_of(layer) is None:
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
        codes, scale = layer.weight.data, _scale_of(layer)
        assert scale is not None  # create_weights checked
        dense = torch.from_numpy(_linear_blocks(layer, codes, scale.float()).to_float32()).to(layer.orig_dtype)
        for name in ("weight_scale_inv", "weight_scale", "input_scale"):
            if hasattr(layer, name):
                delattr(layer, name)
        layer.weight = torch.nn.Parameter(dense, requires_grad=False)
        self.dense.process_weights_after_loading(layer)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = (self.dense or self.own).apply(layer, x, bias)
        return out


def _scale_of(layer: Any) -> torch.Tensor | None:
    scale = getattr(layer, "weight_scale_inv", None)
    scale = scale if scale is not None else getattr(layer, "weight_scale", None)
    return None if scale is None else scale.data


def _linear_blocks(layer: Any, codes: torch.Tensor, scale: torch.Tensor) -> Fp8Blocks:
    """A linear layer's codes ``[N, K]`` and scales as vLLM declared them, as blocks: per block
    (the layer's ``weight_block_size``) or per channel. vLLM has CPU kernels of its own for the
    per-tensor scales, so those layers never come here."""
    N, K = codes.shape
    raw = codes.view(torch.uint8).numpy()
    if getattr(layer, "weight_block_size", None):
        return Fp8Blocks(raw, scale.numpy(), tuple(layer.weight_block_size))
    if scale.numel() != N:
        raise ValueError(f"ktforge: FP8 scales of shape {tuple(scale.shape)} for a [{N}, {K}] layer")
    return Fp8Blocks(raw, scale.reshape(N, 1).numpy(), (1, K))
