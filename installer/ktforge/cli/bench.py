"""`kt bench`: one MoE layer of real models, against this machine's roofline.

For every case the bound is ``max(ops / dot peak, weight bytes touched / read bandwidth)``:
the multiply-adds at the backend's own dot-product peak, or the packed weights (scales
included) of the experts the routing touched, at the read bandwidth; both peaks are measured
in the same run (best of several, every thread). A case reports its median time, its spread
and the % of its bound reached. Backends and the PyTorch peer are timed interleaved (A B A B,
the order rotating each round), so drift on a shared machine hits all of them alike: ratios,
not bare times, are what carry over between runs.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ktforge.builder import backends as backends_table
from ktforge.kernels import MAX_THREADS
from ktforge.resources import data_path, load_toml

# the instruction (sequence) each method's multiply-adds run on, per backend (see its peak_ops)
DOT_PEAK = {"bf16": "bf16_dot", "int8": "int8_dot", "int4": "int4_dot"}
DEFAULT_TOKENS = (1, 4, 16, 64, 128, 512, 2048)
DECODE_MAX_TOKENS = 64  # below: a fresh routing every call (weights stream from memory), 4x the runs
PEAK_RUNS = 7
# Idle cores before each timed call: a pool still spinning must not slow the next contender.
# torch's OpenMP (libgomp) spins about 300,000 rounds after each parallel region (milliseconds):
# with 2 ms, the torch peer's workers made ktforge's int4 decode calls 30% slower and 4x noisier.
GAP_S = 0.010


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int


@dataclass(frozen=True)
class Peaks:
    """One backend's peaks on a number of threads: G op/s (a multiply-add is 2 ops) and GB/s."""

    fp32_fma: float
    bf16_dot: float
    int8_dot: float
    int4_dot: float
    read_gb_per_s: float

    def dot(self, method: str) -> tuple[str, float]:
        """The peak a method's kernels run on (fp32 FMA where the backend has no such instruction)."""
        kind = DOT_PEAK[method]
        value = getattr(self, kind)
        return (kind, value) if value > 0 else ("fp32_fma", self.fp32_fma)

    def best(self, other: Peaks) -> Peaks:
        return Peaks(*(max(a, b) for a, b in zip(asdict(self).values(), asdict(other).values(), strict=True)))


@dataclass(frozen=True)
class Roofline:
    """The fastest a case can run on this machine, and what bounds it."""

    ops: float  # 2 x multiply-adds of the routed tokens
    weight_bytes: float  # packed weights with their scales, of the experts the routing touched
    dot_peak: str
    dot_gops: float
    read_gb_per_s: float
    compute_ms: float
    bandwidth_ms: float
    bound_ms: float
    bound: str  # compute or bandwidth


def roofline(ops: float, weight_bytes: float, peaks: Peaks, method: str) -> Roofline:
    kind, gops = peaks.dot(method)
    compute_ms = ops / (gops * 1e9) * 1e3 if gops > 0 else 0.0
    bandwidth_ms = weight_bytes / (peaks.read_gb_per_s * 1e9) * 1e3 if peaks.read_gb_per_s > 0 else 0.0
    return Roofline(
        ops,
        weight_bytes,
        kind,
        gops,
        peaks.read_gb_per_s,
        compute_ms,
        bandwidth_ms,
        max(compute_ms, bandwidth_ms),
        "compute" if compute_ms >= bandwidth_ms else "bandwidth",
    )


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
    thread_text: list[str],
    repeats: int,
    budget_gib: float | None,
) -> tuple[list[int], list[int]]:
    """Every option value checked before anything is measured; returns the token and thread
    counts. Raises ValueError naming the option, the value and what is accepted."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--method: {', '.join(bad) or 'none given'}; choose from {', '.join(METHODS)}")
    bad = [r for r in routings if r not in ROUTINGS]
    if bad or not routings:
        raise ValueError(f"--routing: {', '.join(bad) or 'none given'}; choose from {', '.join(ROUTINGS)}")
    try:
        tokens = [int(t) for t in token_text] if token_text else list(DEFAULT_TOKENS)
    except ValueError:
        raise ValueError(f"--tokens: {','.join(token_text)!r} is not a list of token counts (e.g. 1,4,128)") from None
    if not tokens or any(t < 1 or t > 1 << 20 for t in tokens):
        raise ValueError(f"--tokens: counts from 1 to {1 << 20}, got {','.join(token_text) or 'none'}")
    if repeats < 1:
        raise ValueError(f"--repeats: at least 1, got {repeats}")
    try:
        threads = [int(t) for t in thread_text]
    except ValueError:
        raise ValueError(f"--threads: {','.join(thread_text)!r} is not a list of thread counts (e.g. 1,2)") from None
    if any(t < 1 or t > MAX_THREADS for t in threads):
        raise ValueError(f"--threads: at least 1 and at most {MAX_THREADS}, got {','.join(thread_text)}")
    available = available_memory()
    for name in model_names:  # the largest case's activations (inputs, gate/up results, outputs)
        activations = max(tokens) * activation_bytes_per_token(models()[name])
        if activations > available // 2:
            raise ValueError(
                f"--tokens {max(tokens)}: {name}'s activations take about {activations / (1 << 30):.1f} GiB, "
                f"over half of the {available / (1 << 30):.1f} GiB available; give fewer tokens"
            )
    if budget_gib is not None:
        if not (math.isfinite(budget_gib) and budget_gib > 0):
            raise ValueError(f"--max-weight-gib: a positive size, got {budget_gib}")
        if budget_gib * (1 << 30) > available:
            raise ValueError(
                f"--max-weight-gib {budget_gib}: more than the {available / (1 << 30):.1f} GiB available; give less"
            )
        for name in model_names:
            model = models()[name]
            if experts_that_fit(model, int(budget_gib * (1 << 30))) < model.top_k:
                need = model.top_k * 3 * model.hidden * model.intermediate * 4 / (1 << 30)
                raise ValueError(
                    f"--max-weight-gib {budget_gib} holds fewer than the {model.top_k} experts one token of {name} "
                    f"routes to; give at least {need:.2f}"
                )
    return tokens, threads or [len(os.sched_getaffinity(0))]


def activation_bytes_per_token(model: Model) -> int:
    """Memory a token takes in a case: its input (fp32 and the peer's bf16 copy), its k experts'
    gate and up results (fp32), its output (kernels' and peer's)."""
    return 4 * model.hidden * 4 + 2 * model.top_k * model.intermediate * 4


def experts_that_fit(model: Model, budget_bytes: int, copies: int = 1) -> int:
    """bf16 source weights plus ``copies`` packed copies (one per backend timed side by side; bf16,
    the largest) must fit in the budget."""
    per_expert = 3 * model.hidden * model.intermediate * 2 * (1 + copies)
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


def _llc_bytes() -> int:
    """The last-level cache of CPU 0 (0 when sysfs does not say)."""
    from pathlib import Path

    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * scale)
    return max(sizes, default=0)


def read_buffer_bytes(quick: bool = False) -> int:
    """At least 8x the last-level cache (so the reads come from memory); 1 GiB where memory
    allows, or 256 MiB for the quick re-measurement after each case."""
    return max(min(256 << 20 if quick else 1 << 30, available_memory() // 8), 8 * _llc_bytes(), 64 << 20)


def peak_method(threads: int) -> str:
    size = read_buffer_bytes()
    return (
        f"compute: best of {PEAK_RUNS} runs of the backend's dot-product sequence (enough independent "
        f"accumulator chains to cover its latency) on each of {threads} threads; read: best of {PEAK_RUNS} "
        f"passes over {size / (1 << 20):.0f} MiB (>= 8x the "
        "last-level cache; transparent huge pages, as the packed weights), each thread streaming its own "
        f"contiguous share, and one pass over {read_buffer_bytes(quick=True) / (1 << 20):.0f} MiB after every "
        "timed round of every case (interleaved with the kernels); compute re-measured after each case; the "
        "best value of the run kept and every case held to it"
    )


def measure_peaks(backend: str, threads: int, runs: int = PEAK_RUNS, with_read: bool = True) -> Peaks:
    """The peaks of ``backend``'s instructions on ``threads`` threads, best of ``runs``; the read
    bandwidth too unless ``with_read`` is false (then 0: no claim)."""
    import ktforge._native as native

    def best(kind: str) -> float:
        # ~20 ms each: on a shared machine the best run is the machine's, the others are noise
        return max(native.measure_peak(backend, kind, threads, 8_000_000) for _ in range(runs)) / 1e9

    read = measure_read(backend, threads, read_buffer_bytes(), runs) if with_read else 0.0
    return Peaks(best("fp32_fma"), best("bf16_dot"), best("int8_dot"), best("int4_dot"), read)


def sample_read(peaks: dict[tuple[str, int], Peaks], simds: Sequence[str], threads: int) -> None:
    """One quick read pass per backend, kept in ``peaks`` where it beats the best so far."""
    for simd in simds:
        gb_per_s = measure_read(simd, threads, read_buffer_bytes(quick=True), 1)
        peaks[simd, threads] = peaks[simd, threads].best(Peaks(0, 0, 0, 0, gb_per_s))


def measure_read(backend: str, threads: int, size: int, runs: int) -> float:
    """GB/s of ``threads`` threads streaming a ``size`` buffer (kept between calls), best of ``runs``."""
    import ktforge._native as native

    return float(native.measure_read_bandwidth(backend, threads, size, runs)) / 1e9


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
) -> tuple[dict[str, list[float]], list[int]]:
    """Seconds per call of every contender, interleaved (the order rotating each round), all on
    the same routing in a round; decode draws a fresh routing every round, so weights come from
    memory. A decode call is timed right after an untimed one of the same contender (another
    routing): in a model, layers call back to back; after an idle gap a virtual machine's
    sleeping CPUs take up to milliseconds to run at speed again, which would be timed instead.
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
            if decode:
                c.call(x, *make_route())  # the lead-in: cores awake, as in a running model
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
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        moe.forward(x, ids, weights)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _result(
    moe: Any,
    model: Model,
    experts: int,
    method: str,
    backend: str,
    tokens: int,
    kind: str,
    threads: int,
    times: list[float],
    touched: list[int],
    peaks: Peaks,
) -> Result:
    H, I, k = model.hidden, model.intermediate, model.top_k
    seconds = statistics.median(times)
    distinct = float(np.mean(touched))
    info = moe.info
    weight_bytes = distinct * info["packed_bytes"] / experts
    ops = 2.0 * tokens * k * 3 * H * I
    roof = roofline(ops, weight_bytes, peaks, method)
    return Result(
        model.name,
        experts,
        method,
        backend,
        info["kernel"],
        tokens,
        kind,
        threads,
        seconds * 1e3,
        min(times) * 1e3,
        max(times) * 1e3,
        100.0 * (max(times) - min(times)) / seconds,
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


def run(
    model_names: list[str],
    methods: list[str],
    backends: list[str],
    token_counts: list[int],
    routings: list[str],
    thread_counts: list[int],
    repeats: int,
    peer: bool,
    budget_gib: float | None,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yields the peaks and fixed costs first ({"peaks": ...}), then one {"result": ...} per
    case and contender, then {"final": ...} with the best peaks of the run and the scaling."""
    import ktforge

    def say(text: str) -> None:
        if progress:
            progress(text)

    all_models = models()
    budget = int((budget_gib * (1 << 30)) if budget_gib else available_memory() * 0.45)
    # a library backend (amd-blis) runs beside a SIMD backend, whose instructions set its peaks
    simds = list(dict.fromkeys(backends_table.simd_of(b) for b in backends))
    peaks: dict[tuple[str, int], Peaks] = {}
    for simd in simds:
        for threads in thread_counts:
            say(f"measuring the peaks of {simd} on {threads} threads")
            peaks[simd, threads] = measure_peaks(simd, threads)
    fixed: dict[str, dict[str, float]] = {}
    for backend in backends:
        say(f"fixed cost per call of {backend}")
        fixed[backend] = {str(t): fixed_cost_us(backend, t) for t in thread_counts}
    yield {
        "threads": thread_counts,
        "peaks": _peaks_json(peaks),
        "peak_method": peak_method(max(thread_counts)),
        "fixed_cost_us": fixed,
        "budget_bytes": budget,
    }
    rng = np.random.default_rng(1)
    results: list[Result] = []
    for name in model_names:
        model = all_models[name]
        experts = experts_that_fit(model, budget, copies=len(backends))
        gate, up, down = make_weights(model, experts)
        for threads in thread_counts:
            torch_peer = TorchPeer(gate, up, down, threads) if peer else None
            for method in methods:
                contenders = []
                for backend in backends:
                    say(f"{name} {method} {backend}: packing")
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
                    contenders.append(Contender(backend, moe.forward, moe))
                if torch_peer is not None:
                    contenders.append(Contender("torch", torch_peer))
                for tokens in token_counts:
                    for kind in routings:
                        say(f"{name} {method} T={tokens} {kind} {threads} threads")
                        decode = tokens < DECODE_MAX_TOKENS
                        x = rng.standard_normal((tokens, model.hidden), dtype=np.float32)

                        make_route = functools.partial(routing, kind, tokens, experts, model.top_k, rng)

                        runs = repeats * (4 if decode else 1)
                        read_pass = functools.partial(sample_read, peaks, simds, threads)
                        times, touched = time_interleaved(contenders, x, make_route, runs, decode, read_pass)
                        for simd in simds:
                            # the machine drifts: its compute peaks again, right after the case (kept:
                            # the best); the read bandwidth was sampled after every round of it
                            again = measure_peaks(simd, threads, runs=2, with_read=False)
                            peaks[simd, threads] = peaks[simd, threads].best(again)
                        torch_s = statistics.median(times["torch"]) if "torch" in times else None
                        for c in contenders:
                            if c.moe is None:
                                continue
                            simd = backends_table.simd_of(c.name)
                            r = _result(
                                c.moe,
                                model,
                                experts,
                                method,
                                c.name,
                                tokens,
                                kind,
                                threads,
                                times[c.name],
                                touched,
                                peaks[simd, threads],
                            )
                            if torch_s is not None:
                                r = replace(r, torch_ms=torch_s * 1e3, speedup_vs_torch=torch_s * 1e3 / r.ms)
                            results.append(r)
                            yield {"result": asdict(r)}
                del contenders
    # Every case against the best peaks of the whole run: a case measured before the machine
    # showed its best would otherwise be held to a lower bound than the cases after it.
    final = [rescore(r, peaks[backends_table.simd_of(r.backend), r.threads]) for r in results]
    yield {"final": {"peaks": _peaks_json(peaks), "scaling": scaling(final), "results": [asdict(r) for r in final]}}


def rescore(result: Result, peaks: Peaks) -> Result:
    """The result against other peaks: its roofline and % of the bound recomputed."""
    roof = roofline(result.roofline.ops, result.roofline.weight_bytes, peaks, result.method)
    return replace(result, roofline=roof, pct_of_bound=100.0 * roof.bound_ms / result.ms)


def _peaks_json(peaks: dict[tuple[str, int], Peaks]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (simd, threads), p in peaks.items():
        out.setdefault(simd, {})[str(threads)] = asdict(p)
    return out


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


# --- text ---------------------------------------------------------------------------------


def format_header(header: dict[str, Any]) -> str:
    lines = ["machine peaks (best of the run so far; the rows below use the peaks so far, the summary the run's best):"]
    for simd, by_threads in header["peaks"].items():
        for threads, p in by_threads.items():
            lines.append(
                f"  {simd:9} {threads:>2} thr  fp32 fma {p['fp32_fma']:7.0f} GFLOP/s  bf16 dot {p['bf16_dot']:7.0f} "
                f"GFLOP/s  int8 dot {p['int8_dot']:7.0f}  int4 dot {p['int4_dot']:7.0f} GOP/s  "
                f"read {p['read_gb_per_s']:5.1f} GB/s"
            )
    lines.append(f"  ({header['peak_method']})")
    for backend, by_threads in header["fixed_cost_us"].items():
        costs = ", ".join(f"{us:.1f} µs on {t} thr" for t, us in by_threads.items())
        lines.append(f"fixed cost per call, {backend}: {costs} (MoE.forward on a tiny layer, median)")
    return "\n".join(lines)


def format_row(r: dict[str, Any]) -> str:
    peer = f"{r['speedup_vs_torch']:5.2f}x" if r["speedup_vs_torch"] is not None else "    -"
    roof = r["roofline"]
    total = models()[r["model"]].experts if r["model"] in models() else r["experts_loaded"]
    name = r["model"] if r["experts_loaded"] == total else f"{r['model']}[{r['experts_loaded']}/{total} experts]"
    basis = "read BW" if roof["bound"] == "bandwidth" else roof["dot_peak"]
    return (
        f"{name:14} {r['method']:5} {r['backend']:9} {r['threads']:>2}thr T={r['tokens']:<5} {r['routing']:7} "
        f"{r['ms']:9.3f} ms ±{r['spread_pct']:4.1f}% {r['tokens_per_s']:9.0f} tok/s "
        f"{r['gflops']:7.1f} GFLOP/s {r['weight_gb_per_s']:6.1f} GB/s  "
        f"bound {roof['bound_ms']:8.3f} ms ({basis:8}) {r['pct_of_bound']:5.1f}% of bound  vs torch {peer}"
    )


def format_summary(results: Sequence[dict[str, Any]]) -> str:
    """% of the roofline bound, method x tokens, one table per backend, threads and routing."""
    lines: list[str] = []
    groups: dict[tuple[str, str, int, str], dict[tuple[str, int], float]] = {}
    for r in results:
        key = (r["model"], r["backend"], r["threads"], r["routing"])
        groups.setdefault(key, {})[r["method"], r["tokens"]] = r["pct_of_bound"]
    for (model, backend, threads, kind), cells in groups.items():
        tokens = sorted({t for _, t in cells})
        methods = list(dict.fromkeys(m for m, _ in cells))
        lines.append(
            f"\n% of roofline bound (against the best peaks of the whole run): {model}, {backend}, {threads} threads, "
            f"{kind} routing"
        )
        lines.append("| method | " + " | ".join(f"T={t}" for t in tokens) + " |")
        lines.append("|---|" + "---:|" * len(tokens))
        for m in methods:
            row = [f"{cells[m, t]:.0f}%" if (m, t) in cells else "-" for t in tokens]
            lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_scaling(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = ["", "scaling (speed-up from the fewest to the most threads; the bound's own ratio beside it):"]
    for s in rows:
        lines.append(
            f"  {s['method']:5} {s['backend']:9} T={s['tokens']:<5} {s['routing']:7} {s['threads'][0]}->"
            f"{s['threads'][1]} threads: {s['speedup']:.2f}x (bound {s['bound_speedup']:.2f}x)"
        )
    return "\n".join(lines)
