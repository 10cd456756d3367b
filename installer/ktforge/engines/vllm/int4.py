"""INT4 checkpoints as they are: GPTQ (4-bit, groups along K, AutoGPTQ's and GPTQModel's layout),
AWQ (AutoAWQ's GEMM layout) and compressed-tensors' ``pack-quantized`` INT4 (Kimi-K2-Thinking's, llm-compressor's W4A16;
symmetric or with zero points).

The routed experts: vLLM's loader fills the layout vLLM's own method for that checkpoint declares
(GPTQ: ``qweight`` int32 ``[E, K / 8, N]``, ``qzeros`` ``[E, G, N / 8]``, ``scales`` ``[E, G, N]``,
K first; AWQ: ``qweight`` ``[E, K, N / 8]``, ``qzeros`` ``[E, G, N / 8]``, ``scales`` ``[E, G, N]``;
compressed-tensors: ``weight_packed`` int32 ``[E, N, K / 8]``, ``weight_scale``
``[E, N, G]``, ``weight_zero_point`` ``[E, N / 8, G]``, N first; gate's rows then up's in
``w13_*``), sliced for this rank as it slices them for itself. After loading each expert becomes
ktforge's ``int4z`` with the file's codes, zero points and scales (read by
:mod:`ktforge.checkpoints.gptq_awq` and :mod:`ktforge.checkpoints.packed`, as ``kt convert`` reads
them), and vLLM's copy is freed. Scales are kept in float32, which holds the file's float16 or
bfloat16 exactly, where vLLM would round them to the model's dtype. vLLM's own INT4 MoE kernels
need AMX; these run on any x86-64 level.

The linear layers stay on vLLM's own kernels where its build has them; its GPTQ and AWQ linear
kernel ``cpu_gemm_wna16`` is in vLLM's AVX-512 build only, so on an AVX2-only CPU a GPTQ or AWQ
checkpoint's linear layers are dequantized to the model's dtype at load, after one log line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod

from ktforge import formats
from ktforge.checkpoints import gptq_awq
from ktforge.checkpoints import packed as ct_packed
from ktforge.engines.vllm.method import KtforgeMoEMethod, declare, say_once, why_unsupported
from ktforge.formats.quantize import Int4Groups, Quantized

METHOD = "int4z"  # zero points and float32 scales: the checkpoints' values exactly
PACK = 8  # 4-bit values an int32 word
Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def why_not_experts(moe: Any, group: int) -> str | None:
    """Why this rank's share of a layer's INT4 experts (groups of ``group``) cannot be served as
    they are (None: it can)."""
    why = why_unsupported(moe)
    if why is not None:
        return why
    inter, hidden = moe.intermediate_size_per_partition, moe.hidden_dim
    if group not in formats.by_name(METHOD).group_sizes:
        return f"its groups are {group} values of K; ktforge's {METHOD} takes {formats.by_name(METHOD).group_sizes}"
    if hidden % group or inter % group or inter % PACK or hidden % PACK:
        return f"this rank's experts ({hidden} x {inter}) are not whole groups of {group} (and words of {PACK})"
    return None


class _Int4Experts(KtforgeMoEMethod):
    """What the INT4 layouts share: parameters declared as vLLM's own method declares them, each
    expert read into int4z after loading, vLLM's copy freed."""

    weights: tuple[str, str] = ("", "")  # the w13 and w2 codes' parameters
    is_transposed = False  # K first (GPTQ) or N first (compressed-tensors): how vLLM's loader slices
    strategy = FusedMoeWeightScaleSupported.GROUP.value

    def __init__(self, moe: Any, group: int) -> None:
        super().__init__(moe, METHOD, group)
        self.group = group

    def shapes(self, experts: int, hidden: int, inter: int) -> Shapes:
        raise NotImplementedError

    def expert(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> Int4Groups:
        """Rows ``rows`` of one expert's projection [N, K] from its parameters (one expert each)."""
        raise NotImplementedError

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        attributes = extra_weight_attrs | {"quant_method": self.strategy, "is_transposed": self.is_transposed}
        shapes = self.shapes(num_experts, hidden_size, intermediate_size_per_partition)
        self.declared = tuple(shapes)
        declare(layer, shapes, lambda _: attributes)

    def process_weights_after_loading(self, layer: Any) -> None:
        # every check ran when the method was chosen (why_not_experts): a failure here is an error
        self._pack(layer)

    def _projection(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> Quantized:
        """One projection of every expert as int4z's portable layout."""
        experts = next(iter(parts.values())).shape[0]
        stored = [self.expert({k: v[e] for k, v in parts.items()}, rows, N, K).as_int4z() for e in range(experts)]
        return Quantized(
            np.stack([q.weight for q in stored]),
            np.stack([q.scale for q in stored if q.scale is not None]),
            np.stack([q.zero for q in stored if q.zero is not None]),  # int4z always has both
        )

    def _pack(self, layer: Any) -> None:
        parts = {name: getattr(layer, name).data for name in self.declared if not name.endswith("_shape")}
        for name, part in parts.items():
            if part.is_floating_point() and not torch.isfinite(part).all():
                raise ValueError(f"ktforge: {layer.layer_name}.{name} holds NaN or infinite scales")
        experts = parts[self.weights[0]].shape[0]
        hidden, inter = self.moe.hidden_dim, self.moe.intermediate_size_per_partition
        w13 = {k: v for k, v in parts.items() if k.startswith("w13")}
        w2 = {k: v for k, v in parts.items() if k.startswith("w2")}
        kernels = self.kernels(experts, hidden, inter, METHOD, self.group)
        kernels.load_quantized(
            self._projection(w13, slice(0, inter), inter, hidden),
            self._projection(w13, slice(inter, 2 * inter), inter, hidden),
            self._projection(w2, slice(0, hidden), hidden, inter),
        )
        for name in self.declared:
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        # the names vLLM's runner and the tests read, as vLLM's own INT4 methods alias them
        layer.w13_weight, layer.w2_weight = (getattr(layer, name) for name in self.weights)
        self._register(layer, kernels, (experts, hidden, inter))


class KtforgeGptqAwqMoEMethod(_Int4Experts):
    """A GPTQ or AWQ checkpoint's routed experts, served in their own values. The two differ in
    ``qweight`` alone: GPTQ packs 8 values of K a word (``[K / 8, N]``), AWQ 8 columns in its own
    order (``[K, N / 8]``); zero points and scales are laid out alike."""

    weights = ("w13_qweight", "w2_qweight")
    is_transposed = True

    def __init__(self, moe: Any, scheme: gptq_awq.Scheme) -> None:
        super().__init__(moe, scheme.group)
        self.scheme = scheme

    def shapes(self, experts: int, hidden: int, inter: int) -> Shapes:
        g, gptq = self.group, self.scheme.method == "gptq"
        return {
            "w13_qweight": (
                (experts, hidden // PACK, 2 * inter) if gptq else (experts, hidden, 2 * inter // PACK),
                torch.int32,
            ),
            "w2_qweight": ((experts, inter // PACK, hidden) if gptq else (experts, inter, hidden // PACK), torch.int32),
            "w13_scales": ((experts, hidden // g, 2 * inter), torch.float32),
            "w2_scales": ((experts, inter // g, hidden), torch.float32),
            "w13_qzeros": ((experts, hidden // g, 2 * inter // PACK), torch.int32),
            "w2_qzeros": ((experts, inter // g, hidden // PACK), torch.int32),
        }

    def expert(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> Int4Groups:
        prefix = next(iter(parts)).split("_", 1)[0]  # w13 or w2
        qweight, scales, qzeros = (parts[f"{prefix}_{n}"] for n in ("qweight", "scales", "qzeros"))
        words = slice(rows.start // PACK, rows.stop // PACK)  # zero points: 8 columns a word
        tensors = {
            gptq_awq.QWEIGHT: qweight[:, rows if self.scheme.method == "gptq" else words].numpy(),
            gptq_awq.QZEROS: qzeros[:, words].numpy(),
            gptq_awq.SCALES: scales[:, rows].numpy(),
        }
        codes, scale, zero, _ = gptq_awq.unpack(self.scheme, tensors, N, K)
        return Int4Groups(codes, scale, self.group, K, zero.astype(np.int8) - 8)


class KtforgeCompressedInt4MoEMethod(_Int4Experts):
    """A compressed-tensors ``pack-quantized`` INT4 checkpoint's routed experts, as they are."""

    weights = ("w13_weight_packed", "w2_weight_packed")

    def __init__(self, moe: Any, scheme: ct_packed.Scheme) -> None:
        super().__init__(moe, scheme.group)
        self.symmetric = scheme.symmetric

    def shapes(self, experts: int, hidden: int, inter: int) -> Shapes:
        g = self.group
        shapes: Shapes = {
            "w13_weight_packed": ((experts, 2 * inter, hidden // PACK), torch.int32),
            "w2_weight_packed": ((experts, hidden, inter // PACK), torch.int32),
            "w13_weight_scale": ((experts, 2 * inter, hidden // g), torch.float32),
            "w2_weight_scale": ((experts, hidden, inter // g), torch.float32),
            "w13_weight_zero_point": ((experts, 2 * inter // PACK, hidden // g), torch.int32),
            "w2_weight_zero_point": ((experts, hidden // PACK, inter // g), torch.int32),
            # the checkpoint's weight_shape tensors: loaded and not needed (the sizes are the layer's)
            "w13_weight_shape": ((experts, 2), torch.float32),
            "w2_weight_shape": ((experts, 2), torch.float32),
        }
        if self.symmetric:  # no zero points in the file
            del shapes["w13_weight_zero_point"], shapes["w2_weight_zero_point"]
        return shapes

    def expert(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> Int4Groups:
        prefix = next(iter(parts)).split("_", 1)[0]  # w13 or w2
        packed_words, scale = parts[f"{prefix}_weight_packed"][rows], parts[f"{prefix}_weight_scale"][rows]
        zero = None
        if not self.symmetric:
            packed_zero = parts[f"{prefix}_weight_zero_point"][rows.start // PACK : rows.stop // PACK]
            zero = ct_packed.zero_points(packed_zero.numpy(), N, K // self.group)
        codes = ct_packed.codes(packed_words.numpy(), N, K, self.group)
        return Int4Groups(codes, scale.numpy(), self.group, K, zero)


def vllm_has_gptq_linear_kernel() -> bool:
    """Whether vLLM's build for this CPU has its GPTQ linear kernel (in ``_C``, not ``_C_AVX2``)."""
    try:
        return hasattr(torch.ops._C, "cpu_gemm_wna16")
    except Exception:  # no _C namespace at all
        return False


class DequantizedInt4LinearMethod(LinearMethodBase):  # type: ignore[misc]
    """vLLM's own method for a checkpoint's GPTQ or AWQ linear layer where vLLM has a kernel for it
    on this CPU; where it has none, the layer's values dequantized to the model's dtype at load."""

    def __init__(self, own: Any, method: str, zero_offset: int) -> None:
        self.own, self.method, self.zero_offset = own, method, zero_offset
        self.dense: UnquantizedLinearMethod | None = None
        self.dtype = torch.bfloat16

    def create_weights(
        self,
        layer: Any,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        self.dtype = params_dtype
        self.own.create_weights(
            layer,
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            params_dtype,
            **extra_weight_attrs,
        )

    def process_weights_after_loading(self, layer: Any) -> None:
        if vllm_has_gptq_linear_kernel():
            self.own.process_weights_after_loading(layer)
            return
        say_once(
            "dequantized-int4-linear",
            "ktforge: vLLM's build for this CPU has no %s linear kernel (cpu_gemm_wna16 is in its AVX-512 "
            "build only): the checkpoint's %s linear layers are dequantized to %s at load; the routed "
            "experts stay %s on ktforge",
            *[self.method.upper()] * 2,
            str(self.dtype).removeprefix("torch."),
            self.method.upper(),
            warning=True,
        )
        qweight = layer.qweight.data
        words, columns = qweight.shape  # GPTQ packs K ([K / 8, N]), AWQ packs N ([K, N / 8])
        K, N = (words * PACK, columns) if self.method == "gptq" else (words, columns * PACK)
        group = self.own.quant_config.group_size
        scheme = gptq_awq.Scheme(self.method, K if group == -1 else int(group), self.zero_offset)
        tensors = {
            gptq_awq.QWEIGHT: qweight.numpy(),
            gptq_awq.QZEROS: layer.qzeros.data.numpy(),
            gptq_awq.SCALES: layer.scales.data.float().numpy(),
        }
        codes, scale, zero, _ = gptq_awq.unpack(scheme, tensors, N, K)
        dense = Int4Groups(codes, scale, scheme.group, K, zero.astype(np.int8) - 8).to_float32()
        for name in ("qweight", "qzeros", "scales"):
            delattr(layer, name)
        layer.weight = torch.nn.Parameter(torch.from_numpy(dense).to(self.dtype), requires_grad=False)
        self.dense = UnquantizedLinearMethod()
        self.dense.process_weights_after_loading(layer)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = (self.dense or self.own).apply(layer, x, bias)
        return out
