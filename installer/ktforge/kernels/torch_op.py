"""``ktforge::moe``: a ktforge MoE layer as a torch operator.

A ``torch.library`` custom operator with a fake (meta) implementation, so graphs that call it
trace under ``torch.compile(fullgraph=True)`` and run under ``torch.inference_mode``. Layers
are registered by an integer handle (an operator takes tensors and numbers, not Python
objects). bf16 and float32 hidden states go to the kernels as they are (no copy) and the
output comes back in their dtype; float16 is widened to float32 and the result narrowed back.

torch is imported here, so this module is imported only by code that uses torch
(the engines: :mod:`ktforge.transformers`, :mod:`ktforge.engines.vllm`); the kernels never need it.
"""

from __future__ import annotations

import threading

import torch

from ktforge.kernels.moe import MoE

_LAYERS: dict[int, MoE] = {}
_SKIPS_ABSENT: set[int] = set()  # handles whose expert id -1 means another process's expert
_LAYERS_LOCK = threading.Lock()


def register_layer(handle: int, layer: MoE, *, skip_absent: bool = False) -> None:
    """``skip_absent``: the layer holds part of the experts (expert parallelism), and an id of -1
    is one it does not hold, which adds nothing (MoE.forward's ``skip_absent``)."""
    with _LAYERS_LOCK:
        _LAYERS[handle] = layer
        if skip_absent:
            _SKIPS_ABSENT.add(handle)
        else:
            _SKIPS_ABSENT.discard(handle)


def unregister_layer(handle: int) -> None:
    """Drop a layer (its packed weights and threads go with it); unknown handles are ignored."""
    with _LAYERS_LOCK:
        _LAYERS.pop(handle, None)
        _SKIPS_ABSENT.discard(handle)


def layer(handle: int) -> MoE:
    try:
        return _LAYERS[handle]
    except KeyError:
        raise ValueError(f"no ktforge layer is registered under handle {handle}") from None


@torch.library.custom_op("ktforge::moe", mutates_args=())
def moe(
    hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, handle: int
) -> torch.Tensor:
    """out[t] = sum_j top_k_weights[t, j] * expert_{top_k_index[t, j]}(hidden_states[t])."""
    x = hidden_states
    if x.dtype == torch.float16:
        x = x.float()
    out: torch.Tensor = layer(handle).forward(
        x.contiguous(), top_k_index.to(torch.int64), top_k_weights.float(), skip_absent=handle in _SKIPS_ABSENT
    )
    return out.to(hidden_states.dtype)


@moe.register_fake
def _(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, handle: int) -> torch.Tensor:
    if top_k_index.shape != top_k_weights.shape:
        raise ValueError(f"top_k_index {tuple(top_k_index.shape)} and top_k_weights differ in shape")
    return torch.empty_like(hidden_states)
