"""One `kt bench` run: peaks first, then every case against them, then every case against the
best peaks of the whole run."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ktforge import formats
from ktforge.bench import bounds
from ktforge.bench import model as catalog
from ktforge.bench.bounds import (
    Peaks,
    Roofline,
    peak_method,
    peaks_json,
    roofline,
    sample_read,
)
from ktforge.bench.model import Model, available_memory, experts_that_fit, make_weights, routing
from ktforge.bench.options import DECODE_MAX_TOKENS, BenchOptions
from ktforge.bench.timing import Contender, TorchPeer, fixed_cost_us, time_interleaved
from ktforge.builder import backends as backends_table


@dataclass
class Result:
    model: str
    experts_loaded: int
    method: str
    backend: str
    kernel: str
    tokens: int
    routing: str
    threads: int
    ms: float  # median
    ms_min: float
    ms_max: float
    spread_pct: float  # (max - min) / median
    ms_p90: float  # the 90th percentile: what a call costs on a bad but not the worst round
    p90_over_median: float
    runs: int
    tokens_per_s: float
    gflops: float
    weight_gb_per_s: float
    experts_touched: float  # distinct experts per call (mean)
    roofline: Roofline
    pct_of_bound: float
    torch_ms: float | None
    speedup_vs_torch: float | None
    profile_ms: dict[str, float] = field(default_factory=dict)


def _p90(times: list[float]) -> float:
    """The 90th percentile, interpolated between the sorted times."""
    ordered = sorted(times)
    position = 0.9 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class _Case:
    model: Model
    experts: int
    method: str
    backend: str
    tokens: int
    routing: str
    threads: int


def _result(moe: Any, case: _Case, times: list[float], touched: list[int], peaks: Peaks) -> Result:
    model, experts, method, tokens = case.model, case.experts, case.method, case.tokens
    H, I, k = model.hidden, model.intermediate, model.top_k
    seconds = statistics.median(times)
    distinct = float(np.mean(touched))
    info = moe.info
    weight_bytes = distinct * info["packed_bytes"] / experts
    ops = 2.0 * tokens * k * 3 * H * I
    # what could stay in the last-level cache from call to call: every loaded expert where each
    # round draws a new routing (decode), the round's own experts where the rounds repeat one
    resident = info["packed_bytes"] if tokens < DECODE_MAX_TOKENS else weight_bytes
    roof = roofline(ops, weight_bytes, peaks, method, in_cache=resident <= bounds.llc_bytes())
    return Result(
        model.name,
        experts,
        method,
        case.backend,
        info["kernel"],
        tokens,
        case.routing,
        case.threads,
        seconds * 1e3,
        min(times) * 1e3,
        max(times) * 1e3,
        100.0 * (max(times) - min(times)) / seconds,
        _p90(times) * 1e3,
        _p90(times) / seconds,
        len(times),
        tokens / seconds,
        ops / seconds / 1e9,
        weight_bytes / seconds / 1e9,
        distinct,
        roof,
        100.0 * roof.bound_ms / (seconds * 1e3),
        None,
        None,
        {key: round(v, 3) for key, v in moe._layer.last_profile().items()},
    )


@dataclass(frozen=True)
class Header:
    """First: the peaks and fixed costs every case is held to."""

    threads: list[int]
    peaks: dict[str, dict[str, dict[str, float]]]
    peak_method: str
    fixed_cost_us: dict[str, dict[str, float]]
    budget_bytes: int
    group_size: int  # of the grouped methods
    activations: str  # the int8 activations' scales: per-block or per-token
    # read GB/s of each NUMA node's CPUs from each node's memory (bounds.node_reads)
    node_reads: list[dict[str, Any]]


@dataclass(frozen=True)
class CaseDone:
    """Then one a case and contender, against the peaks measured so far."""

    result: Result


@dataclass(frozen=True)
class Final:
    """Last: every case against the best peaks of the whole run, and the thread scaling."""

    peaks: dict[str, dict[str, dict[str, float]]]
    scaling: list[dict[str, Any]]
    results: list[Result]


Event = Header | CaseDone | Final


@dataclass
class _Run:
    """What a run carries from case to case."""

    options: BenchOptions
    simds: list[str]  # a library backend (amd-blis) runs beside a SIMD backend, whose instructions set its peaks
    peaks: dict[tuple[str, int], Peaks]
    say: Callable[[str], None]
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(1))


def run(options: BenchOptions, progress: Callable[[str], None] | None = None) -> Iterator[Event]:
    """A Header, then a CaseDone per case and contender, then the Final scores."""
    state = _Run(
        options, list(dict.fromkeys(backends_table.simd_of(b) for b in options.backends)), {}, progress or _quiet
    )
    budget = int((options.budget_gib * (1 << 30)) if options.budget_gib else available_memory() * 0.45)
    yield _header(state, budget)
    results: list[Result] = []
    for name in options.models:
        model = catalog.models()[name]
        experts = experts_that_fit(model, budget, copies=len(options.backends))
        weights = make_weights(model, experts)
        for threads in options.threads:
            for method in options.methods:
                for result in _cases(state, model, experts, weights, method, threads):
                    results.append(result)
                    yield CaseDone(result)
    # Every case against the best peaks of the whole run: a case measured before the machine
    # showed its best would otherwise be held to a lower bound than the cases after it.
    final = [rescore(r, state.peaks[backends_table.simd_of(r.backend), r.threads]) for r in results]
    yield Final(peaks_json(state.peaks), scaling(final), final)


def _quiet(_: str) -> None:
    pass


def _header(state: _Run, budget: int) -> Header:
    threads = list(state.options.threads)
    for simd in state.simds:
        for t in threads:
            state.say(f"measuring the peaks of {simd} on {t} threads")
            state.peaks[simd, t] = bounds.measure_peaks(simd, t)
    fixed: dict[str, dict[str, float]] = {}
    for backend in state.options.backends:
        state.say(f"fixed cost per call of {backend}")
        fixed[backend] = {str(t): fixed_cost_us(backend, t) for t in threads}
    options = state.options
    state.say("read bandwidth of each NUMA node's CPUs from each node's memory")
    nodes = bounds.node_reads(state.simds[0], bounds.read_buffer_bytes(quick=True), 2)
    return Header(
        threads,
        peaks_json(state.peaks),
        peak_method(max(threads)),
        fixed,
        budget,
        options.group_size,
        options.activations,
        nodes,
    )


def _contenders(
    state: _Run, model: Model, experts: int, weights: tuple[Any, Any, Any], method: str, threads: int
) -> list[Contender]:
    import ktforge

    contenders = []
    for backend in state.options.backends:
        state.say(f"{model.name} {method} {backend}: packing")
        moe = ktforge.MoE(
            experts,
            model.top_k,
            model.hidden,
            model.intermediate,
            method=method,
            backend=backend,
            threads=threads,
            group_size=formats.group_for(method, state.options.group_size),
            activations=state.options.activations if formats.by_name(method).activation_block else "per-block",
        )
        moe.load_weights(*weights)
        contenders.append(Contender(backend, moe.forward, moe))
    if state.options.peer:
        contenders.append(Contender("torch", TorchPeer(*weights, threads)))
    return contenders


def _cases(
    state: _Run, model: Model, experts: int, weights: tuple[Any, Any, Any], method: str, threads: int
) -> Iterator[Result]:
    contenders = _contenders(state, model, experts, weights, method, threads)
    for tokens in state.options.tokens:
        for kind in state.options.routings:
            state.say(f"{model.name} {method} T={tokens} {kind} {threads} threads")
            decode = tokens < DECODE_MAX_TOKENS
            x = state.rng.standard_normal((tokens, model.hidden), dtype=np.float32)
            make_route = functools.partial(routing, kind, tokens, experts, model.top_k, state.rng)
            runs = state.options.repeats * (4 if decode else 1)
            read_pass = functools.partial(sample_read, state.peaks, state.simds, threads)
            times, touched = time_interleaved(contenders, x, make_route, runs, decode, read_pass)
            for simd in state.simds:
                # the machine drifts: its compute peaks again, right after the case (kept: the
                # best); the read bandwidth was sampled after every round of it
                again = bounds.measure_peaks(simd, threads, runs=2, with_read=False)
                state.peaks[simd, threads] = state.peaks[simd, threads].best(again)
            torch_s = statistics.median(times["torch"]) if "torch" in times else None
            for c in contenders:
                if c.moe is None:
                    continue
                case = _Case(model, experts, method, c.name, tokens, kind, threads)
                r = _result(c.moe, case, times[c.name], touched, state.peaks[backends_table.simd_of(c.name), threads])
                if torch_s is not None:
                    r = replace(r, torch_ms=torch_s * 1e3, speedup_vs_torch=torch_s * 1e3 / r.ms)
                yield r


def rescore(result: Result, peaks: Peaks) -> Result:
    """The result against other peaks: its roofline and % of the bound recomputed."""
    roof = roofline(result.roofline.ops, result.roofline.weight_bytes, peaks, result.method, result.roofline.in_cache)
    return replace(result, roofline=roof, pct_of_bound=100.0 * roof.bound_ms / result.ms)


def scaling(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Speed-up from the fewest to the most threads measured, per case."""
    by_case: dict[tuple[str, str, str, int, str], dict[int, Result]] = {}
    for r in results:
        by_case.setdefault((r.model, r.method, r.backend, r.tokens, r.routing), {})[r.threads] = r
    out = []
    for (model, method, backend, tokens, kind), runs in by_case.items():
        if len(runs) < 2:
            continue
        low, high = min(runs), max(runs)
        out.append(
            {
                "model": model,
                "method": method,
                "backend": backend,
                "tokens": tokens,
                "routing": kind,
                "threads": [low, high],
                "speedup": runs[low].ms / runs[high].ms,
                # what the bound allows: its own ratio (bandwidth does not always double with threads)
                "bound_speedup": runs[low].roofline.bound_ms / runs[high].roofline.bound_ms,
            }
        )
    return out
