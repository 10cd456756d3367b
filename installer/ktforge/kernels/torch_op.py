"""``ktforge::moe``: a ktforge MoE layer as a torch operator.

A ``torch.library`` custom operator with a fake (meta) implementation, so graphs that call it
trace under ``torch.compile(fullgraph=True)`` and run under ``torch.inference_mode``. Layers
are registered by an integer handle (an operator takes tensors and numbers, not Python
objects). bf16 and float32 hidden states go to the kernels as they are (no copy) and the
output comes back in their dtype; float16 is widened to float32 and the result narrowed back.
Like any torch operator, and unlike ``MoE.forward``, it does not refuse NaN or infinity in the
hidden states or routing weights: those tokens' outputs are NaN.

torch is imported here, so this module is imported only by code that uses torch
(the engines: :mod:`ktforge.transformers`, :mod:`ktforge.engines.vllm`); the kernels never need it.
"""

from __future__ import annotations

import threading
import time

import torch

from ktforge.kernels.moe import MoE

_LAYERS: dict[int, MoE] = {}
_SKIPS_ABSENT: set[int] = set()  # handles whose expert id -1 means another process's expert
_LAYERS_LOCK = threading.Lock()
# what the operator has spent in the kernels in this process (calls, tokens, seconds): an engine's
# benchmark reads it to give the experts' share of a run's time (two clock reads a call)
_SPENT = {"calls": 0, "tokens": 0, "seconds": 0.0}
_SPENT_LOCK = threading.Lock()


def time_spent(*_: object) -> dict[str, float]:
    """What ``ktforge::moe`` has spent in the kernels in this process so far (calls, tokens,
    seconds). Any arguments are ignored, so an engine's per-worker call (vLLM's
    ``collective_rpc``) can take it as it is."""
    with _SPENT_LOCK:
        return dict(_SPENT)


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
    start = time.perf_counter()
    x = hidden_states
    if x.dtype == torch.float16:
        x = x.float()
    x, ids, weights = x.contiguous(), top_k_index.to(torch.int64), top_k_weights.float()
    try:
        out: torch.Tensor = layer(handle).forward(x, ids, weights, skip_absent=handle in _SKIPS_ABSENT)
    except ValueError:
        out = _with_non_finite_tokens(handle, x, ids, weights)
    out = out.to(hidden_states.dtype)
    elapsed = time.perf_counter() - start
    with _SPENT_LOCK:
        _SPENT["calls"] += 1
        _SPENT["tokens"] += x.shape[0]
        _SPENT["seconds"] += elapsed
    return out


def _with_non_finite_tokens(handle: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """As a torch operator does, NaN or infinity in a token's hidden state or routing weights
    gives NaN in that token's output, where ``MoE.forward`` refuses the call: an engine's warm-up
    runs on placeholder values (vLLM's profile run), and one bad token must not fail the others.
    Any other error (an expert id outside the layer, a shape) is raised as it was."""
    bad = ~(torch.isfinite(x).all(dim=1) & torch.isfinite(weights).all(dim=1))
    if not bool(bad.any()):
        raised: torch.Tensor = layer(handle).forward(x, ids, weights, skip_absent=handle in _SKIPS_ABSENT)
        return raised  # (not reached: the same call raises again)
    good, skip = ~bad, handle in _SKIPS_ABSENT
    out = torch.full_like(x, float("nan"))
    if bool(good.any()):
        rows = layer(handle).forward(x[good].contiguous(), ids[good].contiguous(), weights[good], skip_absent=skip)
        out[good] = rows.to(out.dtype)
    return out


@moe.register_fake
def _(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, handle: int) -> torch.Tensor:
    if top_k_index.shape != top_k_weights.shape:
        raise ValueError(f"top_k_index {tuple(top_k_index.shape)} and top_k_weights differ in shape")
    return torch.empty_like(hidden_states)
