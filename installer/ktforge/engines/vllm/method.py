"""ktforge's MoE method for vLLM: the routed experts of one ``RoutedExperts`` layer on ktforge.

vLLM loads the checkpoint's experts into the layer's ``w13_weight`` ``[E, 2I, H]`` (gate rows,
then up rows) and ``w2_weight`` ``[E, H, I]``, as for its own unquantized method; after loading
they are packed into a :class:`ktforge.MoE` in the method asked for, and vLLM's copy is freed.
``apply`` runs the ``ktforge::moe`` torch operator, which Dynamo traces (vLLM compiles its CPU
models with ``fullgraph=True``). The runner around it is vLLM's own: routing, shared experts,
``routed_scaling_factor`` and the tensor-parallel all-reduce. Under expert parallelism
``expert_map`` turns global expert ids into this rank's (-1: another rank's expert, skipped).

What the kernels do not compute runs vLLM's own path, after one log line naming the reason.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.utils import set_weight_attrs

from ktforge import formats
from ktforge.engines.vllm import LOGGER
from ktforge.kernels import torch_op
from ktforge.kernels.moe import MoE

_log = init_logger(LOGGER)
_ids = itertools.count(1)
_said: set[str] = set()  # what this process has logged once
_said_lock = threading.Lock()
ACTIVATIONS = ("silu",)  # vLLM's MoEActivation values the kernels compute (SwiGLU)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def say_once(key: str, message: str, *args: Any, warning: bool = False) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    (_log.warning if warning else _log.info)(message, *args)


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def activation_of(moe: Any) -> dict[str, Any] | None:
    """``ktforge.MoE``'s settings for the layer's activation (``FusedMoEConfig``), None where the
    kernels have none: SwiGLU (silu, clamped where ``swiglu_limit`` is set) and gpt-oss's
    (``swigluoai``: vLLM fixes its alpha and clamp at gpt-oss's 1.702 and 7.0)."""
    name = getattr(moe.activation, "value", str(moe.activation))
    if getattr(moe, "swiglu_beta", None) not in (None, 0.0):
        return None
    if name == "silu":
        if getattr(moe, "swiglu_alpha", None) not in (None, 1.0):
            return None
        limit = getattr(moe, "swiglu_limit", None)
        return {} if limit is None else {"swiglu_limit": float(limit)}
    if name == "swigluoai":
        return {"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "up_offset": 1.0}
    return None


def why_unsupported(moe: Any, activations: tuple[str, ...] = ACTIVATIONS, biases: bool = False) -> str | None:
    """Why ktforge cannot compute a layer of this ``FusedMoEConfig`` exactly (None: it can); a
    method that reads gate/up interleaved and biases (gpt-oss's) passes its own."""
    activation = getattr(moe.activation, "value", str(moe.activation))
    if activation not in activations or activation_of(moe) is None:
        return f"its activation is {activation}, not one the kernels compute here ({', '.join(activations)})"
    if moe.has_bias and not biases:
        return "its experts have biases"
    if getattr(moe, "is_lora_enabled", False):
        return "LoRA is enabled on the experts"
    if moe.moe_parallel_config.enable_eplb:
        return "expert load balancing (EPLB) moves experts between ranks at run time"
    if moe.in_dtype not in DTYPES:
        return f"its activations are {moe.in_dtype}"
    if moe.hidden_dim_unpadded not in (None, moe.hidden_dim):
        return "vLLM pads its hidden size"
    return None


def declare(
    layer: Any, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]], attributes: Callable[[str], dict[str, Any]]
) -> None:
    """Registers a checkpoint layout's parameters on ``layer`` (zeros), each with the attributes
    vLLM's loader reads to slice a checkpoint tensor into it (``attributes(name)``)."""
    for name, (shape, dtype) in shapes.items():
        parameter = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
        layer.register_parameter(name, parameter)
        set_weight_attrs(parameter, attributes(name))


def group_for(method: str, requested: int | None, hidden: int, intermediate: int) -> int:
    """The group size: the one asked for, else the format's largest that divides both K (H and I)."""
    sizes = formats.by_name(method).group_sizes
    if requested is not None or not sizes:
        return requested or 128
    for size in sorted(sizes, reverse=True):
        if hidden % size == 0 and intermediate % size == 0:
            return size
    return min(sizes)


class KtforgeMoEMethod(UnquantizedFusedMoEMethod):  # type: ignore[misc]
    """vLLM's unquantized MoE method, its experts computed by ktforge in ``kt_method``."""

    def __init__(self, moe: Any, kt_method: str = "bf16", group_size: int | None = None) -> None:
        super().__init__(moe)
        self.kt_method, self.kt_group = kt_method, group_size
        self.why_not = why_unsupported(moe)
        self.handle: int | None = None

    @property
    def is_monolithic(self) -> bool:  # ktforge takes vLLM's routing (select_experts), not router logits
        return bool(super().is_monolithic) if self.why_not else False

    @property
    def supports_eplb(self) -> bool:
        return True  # with EPLB the layer runs vLLM's own path (why_unsupported), which supports it

    def process_weights_after_loading(self, layer: Any) -> None:
        if self.why_not is None:
            try:
                self._pack(layer)
                return
            except ValueError as error:  # a size or format the kernels refuse: vLLM's path computes it
                self.why_not = str(error)
        say_once(
            f"fallback:{self.why_not}",
            "ktforge: %s runs vLLM's own MoE kernels: %s",
            layer.layer_name,
            self.why_not,
            warning=True,
        )
        super().process_weights_after_loading(layer)

    def kernels(self, experts: int, hidden: int, inter: int, method: str, group: int, down_group: int = 0) -> MoE:
        """An empty ktforge layer for this vLLM layer: its sizes, top-k and activation, and the
        threads vLLM gave this rank (its OpenMP threads); down in groups of ``down_group`` (0: ``group``)."""
        return MoE(
            experts,
            self.moe.experts_per_token,
            hidden,
            inter,
            method=method,
            group_size=group,
            down_group_size=down_group or None,
            threads=torch.get_num_threads(),
            **(activation_of(self.moe) or {}),
        )

    def _pack(self, layer: Any) -> None:
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        experts, hidden, inter = w2.shape
        if tuple(w13.shape) != (experts, 2 * inter, hidden):
            raise ValueError(f"w13_weight has shape {tuple(w13.shape)}, not {(experts, 2 * inter, hidden)}")
        # the kernels take fp32 or bf16 (f16 experts are packed from fp32: exact)
        dtype = torch.bfloat16 if w13.dtype == torch.bfloat16 else torch.float32
        group = self.kt_group = group_for(self.kt_method, self.kt_group, hidden, inter)
        kernels = self.kernels(experts, hidden, inter, self.kt_method, group)
        kernels.load_weights(
            w13[:, :inter].to(dtype).contiguous(), w13[:, inter:].to(dtype).contiguous(), w2.to(dtype).contiguous()
        )
        # vLLM's copy is no longer read: one copy of the experts in memory, as packed
        for name in ("w13_weight", "w2_weight"):
            getattr(layer, name).data = torch.empty(0, dtype=w13.dtype)
        self._register(layer, kernels, (experts, hidden, inter))

    def _register(self, layer: Any, kernels: MoE, sizes: tuple[int, int, int]) -> None:
        """Makes ``kernels`` this layer's experts for ``apply``, and says so once a format."""
        handle = next(_ids)
        torch_op.register_layer(handle, kernels, skip_absent=layer.expert_map is not None)
        # the packed experts and their threads go with vLLM's layer (a process may load models in turn)
        weakref.finalize(layer, torch_op.unregister_layer, handle)
        self.handle = handle
        info = kernels.info
        say_once(
            f"active:{self.kt_method}:{info.get('kernel')}",
            "ktforge: %s and the MoE layers after it run their routed experts on ktforge: %s%s, %s kernels "
            "(%s), %d threads on CPUs %s, %d experts of %d x %d, %.1f MiB packed a layer",
            layer.layer_name,
            self.kt_method,
            f" (group {self.kt_group})" if formats.by_name(self.kt_method).grouped else "",
            info.get("name"),
            info.get("kernel"),
            int(info.get("threads", 0)),
            _cpu_list(os.sched_getaffinity(0)),  # this thread's: vLLM binds each rank's to its CPUs
            *sizes,
            float(info.get("packed_bytes", 0)) / 2**20,
        )

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: Any,
        shared_experts_input: torch.Tensor | None,
    ) -> torch.Tensor:
        if self.handle is None:
            return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)  # type: ignore[no-any-return]
        ids = topk_ids
        if layer.expert_map is not None:  # global ids to this rank's (-1: another rank's expert)
            ids = layer.expert_map[topk_ids.long()]
        out: torch.Tensor = torch.ops.ktforge.moe(x, ids, topk_weights, self.handle)
        return out


def install() -> None:
    """Makes vLLM build :class:`KtforgeMoEMethod` wherever it builds its unquantized MoE method."""
    from vllm.model_executor.custom_op import op_registry_oot

    name = UnquantizedFusedMoEMethod.__name__
    if op_registry_oot.get(name) is not _DefaultKtforgeMoEMethod:
        if name in op_registry_oot:  # another plugin replaced it first: leave theirs
            say_once("oot", "ktforge: %s is already replaced by %s", name, op_registry_oot[name], warning=True)
            return
        UnquantizedFusedMoEMethod.register_oot(_DefaultKtforgeMoEMethod)


class _DefaultKtforgeMoEMethod(KtforgeMoEMethod):
    """What vLLM builds for an unquantized checkpoint: its experts in their own floats (bf16,
    f16 or f32), nothing rounded."""

    def _pack(self, layer: Any) -> None:
        self.kt_method = _FLOAT_METHODS.get(layer.w13_weight.dtype, "bf16")
        super()._pack(layer)


_FLOAT_METHODS = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
