"""`kt bench`: one MoE layer of real models, measured against this machine's own peaks.

Every figure is put beside a peak measured in the same run (the backend's dot-product
instruction, memory read bandwidth) and, when torch is installed, beside a plain
PyTorch bf16 loop over the same experts: ratios, not bare times, are what carry over
between runs on a shared machine.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ktforge.build import backends as backends_table
from ktforge.resources import data_path, load_toml

BYTES_PER_WEIGHT = {"bf16": 2.0, "int8": 1.0, "int4": 0.5}
PEAK_KIND = {"bf16": "bf16_dot", "int8": "int8_dot", "int4": "int8_dot"}
PREFILL_MIN_TOKENS = 64  # at or above this, a case is judged against compute peak, else bandwidth


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int


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
    ms: float
    tokens_per_s: float
    gflops: float
    weight_gb_per_s: float
    pct_of_peak: float
    peak_kind: str
    torch_ms: float | None
    speedup_vs_torch: float | None
    profile_ms: dict[str, float]


def models() -> dict[str, Model]:
    raw = load_toml(data_path("bench_models.toml"))
    return {name: Model(name, **fields) for name, fields in raw.items()}


def available_memory() -> int:
    from pathlib import Path

    from ktforge.detect.system import parse_meminfo

    try:
        return parse_meminfo(Path("/proc/meminfo").read_text()).get("MemAvailable", 8 << 30)
    except OSError:
        return 8 << 30


METHODS = ("bf16", "int8", "int4")
ROUTINGS = ("uniform", "zipf")


def check_options(
    model_names: list[str],
    methods: list[str],
    token_text: list[str],
    routings: list[str],
    threads: int | None,
    repeats: int,
    budget_gib: float | None,
) -> list[int]:
    """Every option value checked before anything is measured; returns the token counts.
    Raises ValueError naming the option, the value and what is accepted."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--method: {', '.join(bad) or 'none given'}; choose from {', '.join(METHODS)}")
    bad = [r for r in routings if r not in ROUTINGS]
    if bad or not routings:
        raise ValueError(f"--routing: {', '.join(bad) or 'none given'}; choose from {', '.join(ROUTINGS)}")
    try:
        tokens = [int(t) for t in token_text]
    except ValueError:
        raise ValueError(f"--tokens: {','.join(token_text)!r} is not a list of token counts (e.g. 1,4,128)") from None
    if not tokens or any(t < 1 or t > 1 << 20 for t in tokens):
        raise ValueError(f"--tokens: counts from 1 to {1 << 20}, got {','.join(token_text) or 'none'}")
    if repeats < 1:
        raise ValueError(f"--repeats: at least 1, got {repeats}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads: at least 1, got {threads}")
    if budget_gib is not None:
        if not budget_gib > 0:
            raise ValueError(f"--max-weight-gib: a positive size, got {budget_gib}")
        for name in model_names:
            model = models()[name]
            if experts_that_fit(model, int(budget_gib * (1 << 30))) < model.top_k:
                need = model.top_k * 3 * model.hidden * model.intermediate * 4 / (1 << 30)
                raise ValueError(
                    f"--max-weight-gib {budget_gib} holds fewer than the {model.top_k} experts one token of {name} "
                    f"routes to; give at least {need:.2f}"
                )
    return tokens


def experts_that_fit(model: Model, budget_bytes: int) -> int:
    """bf16 source weights plus the largest packed copy (bf16) must fit in the budget."""
    per_expert = 3 * model.hidden * model.intermediate * (2 + 2)
    return max(1, min(model.experts, budget_bytes // per_expert))


def make_weights(model: Model, experts: int, seed: int = 0) -> tuple[Any, Any, Any]:
    """bf16 weights: one random matrix per projection, copied into every expert's own memory
    (the memory traffic is real; generating distinct random numbers for gigabytes is not needed)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    H, I = model.hidden, model.intermediate
    out = []
    for shape in ((I, H), (I, H), (H, I)):
        base = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1])).astype(ml_dtypes.bfloat16)
        full = np.empty((experts, *shape), dtype=ml_dtypes.bfloat16)
        full[:] = base
        out.append(full)
    return out[0], out[1], out[2]


def routing(kind: str, tokens: int, experts: int, top_k: int, rng: np.random.Generator) -> tuple[Any, Any]:
    """ids [T, k] and weights [T, k]. uniform: k distinct experts at random; zipf: k distinct
    experts drawn with probability ~ 1/rank^1.2 (a few hot experts, as in real traffic)."""
    if kind == "uniform":
        ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
    else:
        p = 1.0 / np.arange(1, experts + 1) ** 1.2
        p /= p.sum()
        ids = np.stack([rng.choice(experts, size=top_k, replace=False, p=p) for _ in range(tokens)])
    weights = rng.random((tokens, top_k)).astype(np.float32)
    return ids.astype(np.int64), weights / weights.sum(axis=1, keepdims=True)


def measure_peaks(backend: str, threads: int) -> dict[str, float]:
    import ktforge._native as native

    peaks = {}
    for kind in ("fp32_fma", "bf16_dot", "int8_dot"):
        # best of five ~0.3 s runs: on a shared machine the best run is the machine's, the others are noise
        runs = [native.measure_peak(backend, kind, threads, 8_000_000) for _ in range(5)]
        peaks[kind] = max(runs) / 1e9  # GFLOP/s or GOP/s
    size = min(1 << 30, available_memory() // 8)
    peaks["read_gb_per_s"] = native.measure_read_bandwidth(backend, threads, size, 3) / 1e9
    return peaks


def _timed(fn: Callable[[], Any], repeats: int, fresh: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if fresh:
            fresh()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def run(
    model_names: list[str],
    methods: list[str],
    backends: list[str],
    token_counts: list[int],
    routings: list[str],
    threads: int | None,
    repeats: int,
    peer: bool,
    budget_gib: float | None,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yields the peaks first ({"peaks": ...}), then one {"result": ...} per case."""
    import ktforge

    threads = threads or len(os.sched_getaffinity(0))
    all_models = models()
    budget = int((budget_gib * (1 << 30)) if budget_gib else available_memory() * 0.45)
    # a library backend (amd-blis) runs beside a SIMD backend, whose instructions set its peaks
    peaks = {b: measure_peaks(backends_table.simd_of(b), threads) for b in backends}
    yield {"peaks": peaks, "threads": threads, "budget_bytes": budget}
    rng = np.random.default_rng(1)
    for name in model_names:
        model = all_models[name]
        experts = experts_that_fit(model, budget)
        gate, up, down = make_weights(model, experts)
        pending: list[Result] = []
        for method in methods:
            for backend in backends:
                moe = ktforge.MoE(
                    experts,
                    model.top_k,
                    model.hidden,
                    model.intermediate,
                    method=method,
                    backend=backend,
                    threads=threads,
                    group_size=128,
                )
                moe.load_weights(gate, up, down)
                for tokens in token_counts:
                    for kind in routings:
                        if progress:
                            progress(f"{name} {method} {backend} T={tokens} {kind}")
                        pending.append(
                            _case(
                                moe,
                                model,
                                experts,
                                method,
                                backend,
                                tokens,
                                kind,
                                threads,
                                repeats,
                                peaks[backend],
                                rng,
                            )
                        )
                del moe
        if peer:
            # torch runs after every ktforge case of the model, each library with the cores to
            # itself (torch's OpenMP workers keep spinning after an op and would slow whatever
            # ran next; so would ktforge's pool, briefly)
            torch_peer = TorchPeer(gate, up, down, threads)
            timed: dict[tuple[int, str], float] = {}
            for tokens in token_counts:
                for kind in routings:
                    if progress:
                        progress(f"{name} torch bf16 T={tokens} {kind}")
                    timed[tokens, kind] = _torch_case(torch_peer, model, experts, tokens, kind, repeats, rng)
            for r in pending:
                r.torch_ms = timed[r.tokens, r.routing] * 1e3
                r.speedup_vs_torch = timed[r.tokens, r.routing] * 1e3 / r.ms
        for r in pending:
            yield {"result": asdict(r)}


def _torch_case(
    peer: TorchPeer, model: Model, experts: int, tokens: int, kind: str, repeats: int, rng: np.random.Generator
) -> float:
    x = rng.standard_normal((tokens, model.hidden), dtype=np.float32)
    decode = tokens < PREFILL_MIN_TOKENS
    state = {"route": routing(kind, tokens, experts, model.top_k, rng)}

    def fresh() -> None:
        state["route"] = routing(kind, tokens, experts, model.top_k, rng)

    peer(x, *state["route"])  # warm-up
    return _timed(lambda: peer(x, *state["route"]), repeats * (4 if decode else 1), fresh if decode else None)


def _case(
    moe: Any,
    model: Model,
    experts: int,
    method: str,
    backend: str,
    tokens: int,
    kind: str,
    threads: int,
    repeats: int,
    peaks: dict[str, float],
    rng: np.random.Generator,
) -> Result:
    H, I, k = model.hidden, model.intermediate, model.top_k
    x = rng.standard_normal((tokens, H), dtype=np.float32)
    decode = tokens < PREFILL_MIN_TOKENS
    # decode: a new routing every call, as in generation, so weights come from memory
    state = {"route": routing(kind, tokens, experts, k, rng)}

    def fresh() -> None:
        state["route"] = routing(kind, tokens, experts, k, rng)

    moe.forward(x, *state["route"])  # warm-up
    reps = repeats * (4 if decode else 1)
    seconds = _timed(lambda: moe.forward(x, *state["route"]), reps, fresh if decode else None)
    distinct = float(np.mean([len(np.unique(routing(kind, tokens, experts, k, rng)[0])) for _ in range(8)]))
    weight_bytes = distinct * 3 * H * I * BYTES_PER_WEIGHT[method]
    flops = 2.0 * tokens * k * 3 * H * I
    gflops, gbs = flops / seconds / 1e9, weight_bytes / seconds / 1e9
    peak_kind = "read_gb_per_s" if decode else PEAK_KIND[method]
    if not decode and peaks.get(peak_kind, 0) == 0:
        peak_kind = "fp32_fma"
    peak = peaks[peak_kind]
    if not decode:
        # the machine's speed drifts (shared host): re-measure the matching peak right after
        # the case, and judge against the best value seen
        import ktforge._native as native

        simd = backends_table.simd_of(backend)
        adjacent = max(native.measure_peak(simd, peak_kind, threads, 3_000_000) for _ in range(2)) / 1e9
        peak = max(peak, adjacent)
    pct = 100.0 * (gbs if decode else gflops) / peak if peak else 0.0
    torch_ms = speedup = None  # filled in by run() once torch has been timed
    return Result(
        model.name,
        experts,
        method,
        backend,
        moe.info["kernel"],
        tokens,
        kind,
        threads,
        seconds * 1e3,
        tokens / seconds,
        gflops,
        gbs,
        pct,
        peak_kind,
        torch_ms,
        speedup,
        {key: round(v, 3) for key, v in moe._layer.last_profile().items()},
    )


def format_peaks(peaks: dict[str, dict[str, float]], threads: int) -> str:
    lines = [f"machine peaks ({threads} threads, best of 5):"]
    for backend, p in peaks.items():
        lines.append(
            f"  {backend:9} fp32 fma {p['fp32_fma']:7.0f} GFLOP/s  bf16 dot {p['bf16_dot']:7.0f} GFLOP/s  "
            f"int8 dot {p['int8_dot']:7.0f} GOP/s  read {p['read_gb_per_s']:5.1f} GB/s"
        )
    return "\n".join(lines)


def format_row(r: dict[str, Any]) -> str:
    peer = f"{r['speedup_vs_torch']:5.2f}x" if r["speedup_vs_torch"] is not None else "    -"
    basis = "of read BW" if r["peak_kind"] == "read_gb_per_s" else f"of {r['peak_kind']}"
    total = models()[r["model"]].experts if r["model"] in models() else r["experts_loaded"]
    name = r["model"] if r["experts_loaded"] == total else f"{r['model']}[{r['experts_loaded']}/{total} experts]"
    return (
        f"{name:14} {r['method']:5} {r['backend']:9} T={r['tokens']:<4} {r['routing']:7} "
        f"{r['ms']:9.2f} ms {r['tokens_per_s']:9.0f} tok/s {r['gflops']:7.1f} GFLOP/s "
        f"{r['weight_gb_per_s']:6.1f} GB/s {r['pct_of_peak']:5.1f}% {basis:15} vs torch {peer}"
    )
