"""The roofline of a case: the machine's peaks (dot products of each method, read bandwidth),
measured in the same run, and the bound ``max(ops / dot peak, weight bytes / read bandwidth)``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ktforge import formats
from ktforge.bench.model import available_memory
from ktforge.detect.topology import read_live
from ktforge.kernels import numa

# the instruction (sequence) each element family's multiply-adds run on, per backend (see its
# peak_ops); a format runs on its element's (data/formats.json)
DOT_PEAK = {
    "bf16": "bf16_dot",
    "int8": "int8_dot",
    "int8g": "int8_dot",
    "int4": "int4_dot",
    "fp8": "bf16_dot",
    "mxfp8": "bf16_dot",  # fp8's, a scale per 32 values of each column
    "fp4": "int4_dot",  # int4's dot products, on codes looked up by one byte shuffle
    "nvfp4": "int4_dot",  # fp4's, its UE4M3 group scales widened through float16
    "int4z": "int4_dot",  # int4's, less the zero points per group
    "q4k": "int4_dot",  # int4z's, with Q4_K's scales and mins per group
    "int8h": "int8_dot",  # int8g's, float16 scales
    "q6k": "int4_dot",  # int4's unpacked nibbles, two high bits added to each
    "q5k": "int4_dot",  # q4k's, a high bit added to each code
    "iq4nl": "int4_dot",  # fp4's, on the IQ4 grid's values
    "iq4xs": "int4_dot",
    "q3k": "int4_dot",  # int8 dot products on codes built from two bit planes, as q6k's
    "q2k": "int4_dot",  # q3k's, one plane
    "iq2xxs": "int4_dot",  # int8 dot products on grid points gathered and signed in registers
    "iq2xs": "int4_dot",
    "iq3xxs": "int4_dot",
    "iq1s": "int4_dot",
    "q40": "int4_dot",  # int4's, float16 scales
    "q41": "int4_dot",
    "q50": "int4_dot",  # q5k's codes
    "q51": "int4_dot",
    "f16": "fp32_fma",  # float16 widened in registers
    "f32": "fp32_fma",
}

PEAK_RUNS = 7


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
        kind = DOT_PEAK[formats.by_name(method).element]
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
    in_cache: bool = False  # the weights a call reads fit the last-level cache: no memory bound holds


def roofline(ops: float, weight_bytes: float, peaks: Peaks, method: str, in_cache: bool = False) -> Roofline:
    """The bound of a case; ``in_cache``: its weights may be served from the last-level cache, so
    it is held to the compute peak alone (a read-bandwidth bound would not be one)."""
    kind, gops = peaks.dot(method)
    compute_ms = ops / (gops * 1e9) * 1e3 if gops > 0 else 0.0
    bandwidth_ms = weight_bytes / (peaks.read_gb_per_s * 1e9) * 1e3 if peaks.read_gb_per_s > 0 else 0.0
    if in_cache:
        bandwidth_ms = 0.0
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
        in_cache,
    )


@functools.cache
def llc_bytes() -> int:
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
    return max(min(256 << 20 if quick else 1 << 30, available_memory() // 8), 8 * llc_bytes(), 64 << 20)


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
    """GB/s of ``threads`` threads streaming a ``size`` buffer (kept between calls), best of ``runs``.
    Where MoE(numa="auto") splits a layer over nodes, the sum of each share's threads reading its
    own node's memory, one node after the other: the bound of a layer whose shares read only locally."""
    import ktforge._native as native

    shares = numa.resolve("auto", threads)
    if not shares:
        return float(native.measure_read_bandwidth(backend, threads, size, runs)) / 1e9
    part = size // len(shares)
    return sum(native.measure_node_read_bandwidth(backend, list(s.cpus), s.node, part, runs) for s in shares) / 1e9


def node_reads(backend: str, size: int, runs: int) -> list[dict[str, Any]]:
    """Read GB/s of each node's usable CPUs from each node's memory this process may use: the
    local cells (CPUs and memory on one node) and the remote ones, a row a CPU node."""
    import ktforge._native as native

    topology = read_live()
    allowed = set(topology.memory_nodes) if topology.memory_nodes is not None else None
    memories = [n.id for n in topology.nodes if (n.memory_bytes or 0) > 0 and (allowed is None or n.id in allowed)]
    cells = []
    for node in topology.usable_nodes():
        for memory in memories:
            gb = native.measure_node_read_bandwidth(backend, list(node.usable_cpus), memory, size, runs) / 1e9
            cells.append({"cpu_node": node.id, "memory_node": memory, "threads": len(node.usable_cpus), "gb_per_s": gb})
    return cells


def peaks_json(peaks: dict[tuple[str, int], Peaks]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (simd, threads), p in peaks.items():
        out.setdefault(simd, {})[str(threads)] = asdict(p)
    return out
