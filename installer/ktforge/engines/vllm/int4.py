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
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)

from ktforge import formats
from ktforge.checkpoints import gptq_awq
from ktforge.checkpoints import packed as ct_packed
from ktforge.engines.vllm.method import KtforgeMoEMethod, declare, say_once, why_unsupported
from ktforge.formats.quantize import Int4Groups, Quantized
from ktforge.kernels import stored as stored_formats

METHOD = "int4z"  # zero points and float32 scales: the checkpoints' values exactly
PACK = 8  # 4-bit values an int32 word
Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def why_not_experts(moe: Any, group: int, regrouped: bool = False) -> str | None:
    """Why this rank's share of a layer's INT4 experts (groups of ``group``) cannot be served as
    they are (None: it can); ``regrouped``: down's groups are made anew on this rank (GPTQ with
    ``g_idx``), so its inputs need not be whole groups."""
    why = why_unsupported(moe)
    if why is not None:
        return why
    inter, hidden = moe.intermediate_size_per_partition, moe.hidden_dim
    if group not in formats.by_name(METHOD).group_sizes:
        return f"its groups are {group} values of K; ktforge's {METHOD} takes {formats.by_name(METHOD).group_sizes}"
    if hidden % group or (inter % group and not regrouped) or inter % PACK or hidden % PACK:
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

    def _projection(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> list[Quantized]:
        """One projection of each expert in int4z's portable layout (with its act-order, if any)."""
        experts = next(iter(parts.values())).shape[0]
        return [self.expert({k: v[e] for k, v in parts.items()}, rows, N, K).as_int4z() for e in range(experts)]

    def _projections(self, parts: dict[str, torch.Tensor]) -> tuple[dict[str, list[Quantized]], int]:
        """Each projection of every expert in int4z's layout, and down's group size."""
        hidden, inter = self.moe.hidden_dim, self.moe.intermediate_size_per_partition
        w13 = {k: v for k, v in parts.items() if k.startswith("w13")}
        w2 = {k: v for k, v in parts.items() if k.startswith("w2")}
        projections = {
            "gate": self._projection(w13, slice(0, inter), inter, hidden),
            "up": self._projection(w13, slice(inter, 2 * inter), inter, hidden),
            "down": self._projection(w2, slice(0, hidden), hidden, inter),
        }
        return projections, self.group

    def _pack(self, layer: Any) -> None:
        parts = {name: getattr(layer, name).data for name in self.declared if not name.endswith("_shape")}
        for name, part in parts.items():
            if part.is_floating_point() and not torch.isfinite(part).all():
                raise ValueError(f"ktforge: {layer.layer_name}.{name} holds NaN or infinite scales")
        experts = parts[self.weights[0]].shape[0]
        projections, down_group = self._projections(parts)
        hidden, inter = self.moe.hidden_dim, projections["gate"][0].weight.shape[0]
        kernels = self.kernels(experts, hidden, inter, METHOD, self.group, down_group)
        arrays = {
            f"{p}.{part}": np.stack([getattr(q, part) for q in stored])
            for p, stored in projections.items()
            for part in ("weight", "scale", "zero")
        }
        orders = {
            (e, p): q.order for p, stored in projections.items() for e, q in enumerate(stored) if q.order is not None
        }
        input_order = stored_formats.act_order(arrays, orders, experts, hidden) if orders else None
        kernels.load_quantized(
            *(Quantized(arrays[f"{p}.weight"], arrays[f"{p}.scale"], arrays[f"{p}.zero"]) for p in projections)
        )
        if input_order is not None:
            kernels.load_input_order(input_order)
        for name in self.declared:
            getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype)
        # the names vLLM's runner and the tests read, as vLLM's own INT4 methods alias them
        layer.w13_weight, layer.w2_weight = (getattr(layer, name) for name in self.weights)
        self._register(layer, kernels, (experts, hidden, inter))


class KtforgeGptqAwqMoEMethod(_Int4Experts):
    """A GPTQ or AWQ checkpoint's routed experts, served in their own values. The two differ in
    ``qweight`` alone: GPTQ packs 8 values of K a word (``[K / 8, N]``), AWQ 8 columns in its own
    order (``[K, N / 8]``); zero points and scales are laid out alike. With ``g_idx`` (a GPTQ
    checkpoint vLLM refuses: act-order) each expert's ``g_idx`` is read too, and an act-order
    expert takes its input in its own order (``MoE.load_input_order``)."""

    weights = ("w13_qweight", "w2_qweight")
    is_transposed = True

    def __init__(self, moe: Any, scheme: gptq_awq.Scheme, g_idx: bool = False) -> None:
        super().__init__(moe, scheme.group)
        self.scheme, self.g_idx = scheme, g_idx

    def shapes(self, experts: int, hidden: int, inter: int) -> Shapes:
        g, gptq = self.group, self.scheme.method == "gptq"
        shapes: Shapes = {
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
        if self.g_idx:  # gate's and up's (each over H), down's (over this rank's I)
            shapes |= {"w13_g_idx": ((experts, 2, hidden), torch.int32), "w2_g_idx": ((experts, inter), torch.int32)}
            # act-order: a rank's share of down's inputs may be in any group, so every rank keeps all
            groups = self.moe.intermediate_size // g
            shapes |= {
                "w2_scales": ((experts, groups, hidden), torch.float32),
                "w2_qzeros": ((experts, groups, hidden // PACK), torch.int32),
            }
        return shapes

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        super().create_weights(
            layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra_weight_attrs
        )
        if not self.g_idx:
            return
        first = self.moe.tp_rank * intermediate_size_per_partition  # this rank's first input of down
        layer.w13_g_idx.data[:] = (torch.arange(hidden_size) // self.group).to(torch.int32)  # a file without g_idx
        layer.w2_g_idx.data[:] = ((torch.arange(intermediate_size_per_partition) + first) // self.group).to(torch.int32)
        for name in ("w13_g_idx", "w2_g_idx", "w2_scales", "w2_qzeros"):
            getattr(layer, name).weight_loader = self._act_order_loader(layer)

    def _act_order_loader(self, layer: Any) -> Any:
        """vLLM's loader has no case for a g_idx, nor for down's groups kept whole on every rank:
        this one puts an expert's in place (down's g_idx sliced as its rows are, its scales and
        zero points whole)."""
        inter, rank = self.moe.intermediate_size_per_partition, self.moe.tp_rank

        def load(  # vLLM's loaders pass these by name
            param: Any,
            loaded_weight: torch.Tensor,
            weight_name: str,
            shard_id: str,
            expert_id: int,
            return_success: bool = False,
        ) -> bool | None:
            local = layer._map_global_expert_id_to_local_expert_id(expert_id)
            if local == -1:  # another rank's expert
                return False if return_success else None
            if shard_id == "w2" and param is layer.w2_g_idx:
                param.data[local].copy_(loaded_weight.narrow(0, rank * inter, inter))
            elif shard_id == "w2":
                param.data[local].copy_(loaded_weight)
            else:
                param.data[local, 0 if shard_id == "w1" else 1].copy_(loaded_weight)
            return True if return_success else None

        return load

    def _projections(self, parts: dict[str, torch.Tensor]) -> tuple[dict[str, list[Quantized]], int]:
        """With ``g_idx``, down's inputs on this rank may be any of its groups' (act-order split
        over tensor-parallel ranks): each group's made contiguous and padded to whole groups of
        ``regrouped_size``'s (padding weighs 0), gate's and up's rows in that order (zero rows for
        the padding), so the intermediate activation comes out in it."""
        if not self.g_idx:
            return super()._projections(parts)
        hidden, inter = self.moe.hidden_dim, self.moe.intermediate_size_per_partition
        w13 = {k: v for k, v in parts.items() if k.startswith("w13")}
        g_idx = parts["w2_g_idx"].numpy()
        groups = parts["w2_scales"].shape[1]
        counts = np.stack([gptq_awq.group_counts(g, groups) for g in g_idx])
        down_group, length = gptq_awq.regrouped_size(counts, tuple(formats.by_name(METHOD).group_sizes))
        down, orders = [], []
        for e in range(g_idx.shape[0]):
            tensors = {
                gptq_awq.QWEIGHT: parts["w2_qweight"][e].numpy(),
                gptq_awq.QZEROS: parts["w2_qzeros"][e].numpy(),
                gptq_awq.SCALES: parts["w2_scales"][e].numpy(),
                gptq_awq.G_IDX: g_idx[e],
            }
            codes, scale, zero, order = gptq_awq.unpack_regrouped(
                self.scheme, tensors, hidden, inter, down_group, length
            )
            down.append(Quantized(codes, scale, zero))
            orders.append(order)
        if length != inter:
            say_once(
                "regrouped-act-order",
                "ktforge: act-order GPTQ experts over %d tensor-parallel ranks: each rank's share of down's "
                "inputs holds parts of its groups, made whole groups of %d with zero weights: %d of %d columns "
                "(+%d%%); --enable-expert-parallel keeps whole experts a rank, with no padding",
                self.moe.tp_size,
                down_group,
                length,
                inter,
                round(100 * (length - inter) / max(inter, 1)),
                warning=True,
            )
        gate_up = {
            name: [
                _rows_in(q, order) for q, order in zip(self._projection(w13, rows, inter, hidden), orders, strict=True)
            ]
            for name, rows in (("gate", slice(0, inter)), ("up", slice(inter, 2 * inter)))
        }
        return gate_up | {"down": down}, down_group

    def expert(self, parts: dict[str, torch.Tensor], rows: slice, N: int, K: int) -> Int4Groups:
        prefix = next(iter(parts)).split("_", 1)[0]  # w13 or w2
        qweight, scales, qzeros = (parts[f"{prefix}_{n}"] for n in ("qweight", "scales", "qzeros"))
        words = slice(rows.start // PACK, rows.stop // PACK)  # zero points: 8 columns a word
        tensors = {
            gptq_awq.QWEIGHT: qweight[:, rows if self.scheme.method == "gptq" else words].numpy(),
            gptq_awq.QZEROS: qzeros[:, words].numpy(),
            gptq_awq.SCALES: scales[:, rows].numpy(),
        }
        if self.g_idx and prefix == "w13":  # gate's or up's (down's, with g_idx: _projections)
            tensors[gptq_awq.G_IDX] = parts["w13_g_idx"][0 if rows.start == 0 else 1].numpy()
        codes, scale, zero, order = gptq_awq.unpack(self.scheme, tensors, N, K)
        return Int4Groups(codes, scale, self.group, K, zero.astype(np.int8) - 8, order)


def _rows_in(q: Quantized, order: np.ndarray[Any, Any]) -> Quantized:
    """``q``'s rows in ``order``, a row of zero weights (scale 0) where it says -1."""
    assert q.scale is not None and q.zero is not None
    pick, pad = np.maximum(order, 0), order < 0
    weight, scale, zero = q.weight[pick], q.scale[pick], q.zero[pick]
    scale[pad] = 0.0
    return Quantized(weight, scale, zero, q.order)


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
        self.dense = dequantized(layer, scheme, N, K, self.dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = (self.dense or self.own).apply(layer, x, bias)
        return out


def dequantized(layer: Any, scheme: gptq_awq.Scheme, N: int, K: int, dtype: torch.dtype) -> UnquantizedLinearMethod:
    """The layer's GPTQ or AWQ tensors replaced by its values in ``dtype`` (``layer.weight``), and
    vLLM's dense method for it."""
    tensors = {
        gptq_awq.QWEIGHT: layer.qweight.data.numpy(),
        gptq_awq.QZEROS: layer.qzeros.data.numpy(),
        gptq_awq.SCALES: layer.scales.data.float().numpy(),
    }
    if hasattr(layer, "g_idx"):
        tensors[gptq_awq.G_IDX] = layer.g_idx.data.numpy()
    values = gptq_awq.dense(scheme, tensors, N, K)
    for name in ("qweight", "qzeros", "scales", "g_idx"):
        if hasattr(layer, name):
            delattr(layer, name)
    layer.weight = torch.nn.Parameter(torch.from_numpy(values).to(dtype), requires_grad=False)
    dense = UnquantizedLinearMethod()
    dense.process_weights_after_loading(layer)
    return dense


@register_weight_loader_v2_supported_method  # its parameters load as vLLM's own GPTQ ones (by their class)
class DequantizedGptqLinearMethod(LinearMethodBase):  # type: ignore[misc]
    """A linear layer of a GPTQ checkpoint vLLM refuses (act-order, asymmetric): its tensors
    declared as AutoGPTQ writes them, ``g_idx`` included, and its values dequantized to the model's
    dtype at load. With act-order a rank's share of a row-parallel layer's inputs may hold any
    group, so every rank keeps every group's scales and zero points."""

    def __init__(self, group: int, zero_offset: int) -> None:
        self.group, self.zero_offset = group, zero_offset
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
        from vllm.distributed import get_tensor_model_parallel_rank
        from vllm.model_executor.parameter import (
            ChannelQuantScaleParameter,
            PackedColumnParameter,
            PackedvLLMParameter,
            RowvLLMParameter,
        )

        self.dtype = params_dtype
        K, N, loader = input_size_per_partition, sum(output_partition_sizes), extra_weight_attrs["weight_loader"]
        group = input_size if self.group == -1 else self.group
        if K % PACK or N % PACK or input_size % group:
            raise ValueError(
                f"ktforge: a GPTQ layer of {input_size} inputs ({K} here) x {N} outputs is not 8s and groups of {group}"
            )
        rank = get_tensor_model_parallel_rank() if input_size != K else 0
        first = rank * K  # this rank's first input: a checkpoint without g_idx has k // group
        parameters = {
            "qweight": PackedvLLMParameter(
                data=torch.zeros(K // PACK, N, dtype=torch.int32),
                input_dim=0,
                output_dim=1,
                packed_dim=0,
                packed_factor=PACK,
                weight_loader=loader,
            ),
            "g_idx": RowvLLMParameter(
                data=((torch.arange(K) + first) // group).to(torch.int32), input_dim=0, weight_loader=loader
            ),
            "qzeros": PackedColumnParameter(
                data=torch.zeros(input_size // group, N // PACK, dtype=torch.int32),
                output_dim=1,
                packed_dim=1,
                packed_factor=PACK,
                weight_loader=loader,
            ),
            "scales": ChannelQuantScaleParameter(
                data=torch.zeros(input_size // group, N, dtype=params_dtype), output_dim=1, weight_loader=loader
            ),
        }
        for name, parameter in parameters.items():
            layer.register_parameter(name, parameter)

    def process_weights_after_loading(self, layer: Any) -> None:
        say_once(
            "dequantized-gptq-linear",
            "ktforge: vLLM serves no GPTQ with act-order or asymmetric groups: the checkpoint's GPTQ linear "
            "layers are dequantized to %s at load; the routed experts stay GPTQ on ktforge",
            str(self.dtype).removeprefix("torch."),
            warning=True,
        )
        words, N = layer.qweight.data.shape
        group = words * PACK if self.group == -1 else self.group
        self.dense = dequantized(layer, gptq_awq.Scheme("gptq", group, self.zero_offset), N, words * PACK, self.dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert self.dense is not None, "the layer's weights were not loaded"
        out: torch.Tensor = self.dense.apply(layer, x, bias)
        return out
