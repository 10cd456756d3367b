"""Timing contenders interleaved (A B A B, the order rotating each round), so drift on a
shared machine hits all of them alike; the PyTorch peer; the fixed cost of a call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Idle cores before each timed call: a pool still spinning must not slow the next contender.
# torch's OpenMP (libgomp) spins about 300,000 rounds after each parallel region (milliseconds):
# with 2 ms, the torch peer's workers made ktforge's int4 decode calls 30% slower and 4x noisier.
GAP_S = 0.010
# A decode call's lead-in after that gap: calls of the same contender for at least this long.
# A virtual machine's idle CPUs take milliseconds to run at speed again: on a 2-vCPU Sapphire
# Rapids guest an int8 one-token call after 10 ms idle took 4.1 ms (median) after one lead-in
# call, 1.8 after 2, 1.6 after 8, as back to back (1.6).
LEAD_IN_S = 0.010


class TorchPeer:
    """A plain PyTorch CPU MoE loop in bf16: what a user writes without ktforge."""

    def __init__(self, gate: Any, up: Any, down: Any, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.torch = torch

        def as_tensor(a: Any) -> Any:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)

        self.gate, self.up, self.down = as_tensor(gate), as_tensor(up), as_tensor(down)

    def __call__(self, x: Any, ids: Any, weights: Any) -> Any:
        torch = self.torch
        xt = torch.from_numpy(x).to(torch.bfloat16)
        idt, wt = torch.from_numpy(ids), torch.from_numpy(weights).to(torch.bfloat16)
        out = torch.zeros_like(xt)
        with torch.inference_mode():
            for e in torch.unique(idt).tolist():
                tok, slot = torch.nonzero(idt == e, as_tuple=True)
                xe = xt[tok]
                h = torch.nn.functional.silu(xe @ self.gate[e].T) * (xe @ self.up[e].T)
                out.index_add_(0, tok, (h @ self.down[e].T) * wt[tok, slot, None])
        return out


@dataclass
class Contender:
    name: str  # a ktforge backend, or "torch"
    call: Callable[[Any, Any, Any], Any]
    moe: Any = None


def time_interleaved(
    contenders: Sequence[Contender],
    x: Any,
    make_route: Callable[[], tuple[Any, Any]],
    runs: int,
    decode: bool,
    each_round: Callable[[], None] = lambda: None,
    lead_in_s: float = LEAD_IN_S,
) -> tuple[dict[str, list[float]], list[int]]:
    """Seconds per call of every contender, interleaved (the order rotating each round), all on
    the same routing in a round; decode draws a fresh routing every round, so weights come from
    memory. A decode call is timed right after untimed ones of the same contender (each on
    another routing), at least one and for at least ``lead_in_s``: in a model, layers call back
    to back; after an idle gap a virtual machine's sleeping CPUs take milliseconds to run at
    speed again, which would be timed instead.
    ``each_round`` runs after every round (the read-bandwidth pass: the bound's own
    measurement interleaved with the kernels'). Returns the times and the distinct experts of
    each round's routing."""
    route = make_route()
    for c in contenders:
        c.call(x, *route)  # warm-up
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    touched: list[int] = []
    for i in range(runs):
        if decode:
            route = make_route()
        touched.append(len(np.unique(route[0])))
        shift = i % len(contenders)
        for c in [*contenders[shift:], *contenders[:shift]]:
            time.sleep(GAP_S)
            if decode:  # the lead-in: cores awake, as in a running model
                lead_in_end = time.perf_counter() + lead_in_s
                c.call(x, *make_route())
                while time.perf_counter() < lead_in_end:
                    c.call(x, *make_route())
            start = time.perf_counter()
            c.call(x, *route)
            times[c.name].append(time.perf_counter() - start)
        each_round()
    return times, touched


def fixed_cost_us(backend: str, threads: int, calls: int = 300) -> float:
    """Median µs of one MoE.forward on a tiny layer (8 experts, top-2, 64 x 64, one token): what
    every call pays besides its arithmetic and weight traffic."""
    import ktforge

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 64, 64)) / 8).astype(np.float32)
    moe = ktforge.MoE(8, 2, 64, 64, method="bf16", backend=backend, threads=threads)
    moe.load_weights(w, w, w)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    ids, weights = np.array([[1, 5]], dtype=np.int64), np.array([[0.5, 0.5]], dtype=np.float32)
    for _ in range(50):
        moe.forward(x, ids, weights)
    return median_call_s(moe, x, ids, weights, calls) * 1e6


def median_call_s(moe: Any, x: Any, ids: Any, weights: Any, calls: int) -> float:
    """Median seconds of ``calls`` back-to-back ``moe.forward`` calls on one routing."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        moe.forward(x, ids, weights)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
