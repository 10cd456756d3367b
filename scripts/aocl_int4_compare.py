"""AOCL-BLAS's int4 entry point against ktforge's own int4 kernels, same work, same run.

    KTFORGE_BLIS_LIBRARY=/path/to/libblis-mt-*.so python scripts/aocl_int4_compare.py

AOCL's int4 GEMM is `aocl_gemm_bf16s4f32of32`: bf16 activations, signed int4 weights (two per
byte) reordered once with `aocl_reorder_bf16s4f32of32`, and per-group scales (group 128) passed
as its pre-op (struct layout of AOCL-BLAS 5.x's aocl_gemm_post_ops.h; the library ships no
headers). The work is one Qwen3-30B-A3B layer at 512 tokens with uniform routing, 32 tokens per
expert: for each of the 128 experts a 32 x 2048 by 2048 x 1536 GEMM (gate and up) and a 32 x 768
by 768 x 2048 one (down), one expert per thread with BLIS single-threaded (the amd-blis
backend's arrangement). ktforge's figure is its whole layer (routing, activation quantization,
SiLU, combine included). Each is the median of 5 runs; the ratio is what carries over.
A self-check first runs a small AOCL GEMM against its expected result.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

H, I, E, TOP_K, T = 2048, 768, 128, 8, 512
M = T * TOP_K // E  # tokens per expert


def load(path: str) -> ctypes.CDLL:
    for sibling in sorted(Path(path).parent.glob("libomp*.so*")):  # the wheel bundles its OpenMP
        ctypes.CDLL(str(sibling), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    c, i64, p, f = ctypes.c_char, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.aocl_get_reorder_buf_size_bf16s4f32of32.restype = ctypes.c_uint64
    lib.aocl_get_reorder_buf_size_bf16s4f32of32.argtypes = [c, c, c, i64, i64]
    lib.aocl_reorder_bf16s4f32of32.argtypes = [c, c, c, p, p, i64, i64, i64]
    lib.aocl_gemm_bf16s4f32of32.argtypes = [c, c, c, i64, i64, i64, f, p, i64, c, p, i64, c, f, p, i64, p]
    lib.bli_thread_set_num_threads.argtypes = [i64]
    lib.bli_thread_set_num_threads(1)
    return lib


class ScaleFactor(ctypes.Structure):
    _fields_ = [("scale_factor", ctypes.c_void_p), ("length", ctypes.c_int64), ("storage_type", ctypes.c_int)]


class PreOp(ctypes.Structure):
    _fields_ = [
        ("b_zero_point", ctypes.c_void_p),
        ("b_scale", ctypes.POINTER(ScaleFactor)),
        ("seq_length", ctypes.c_int64),
        ("group_size", ctypes.c_int64),
    ]


class PostOp(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_void_p) for name in ("sum", "eltwise", "bias", "matrix_add", "matrix_mul")),
        ("seq_length", ctypes.c_int64),
        ("seq_vector", ctypes.c_void_p),
        ("pre_ops", ctypes.POINTER(PreOp)),
        ("post_op_group", ctypes.c_void_p),
        ("num_eltwise", ctypes.c_int64),
    ]


GROUP = 128


def group_scales(scales: np.ndarray) -> tuple[PostOp, list[object]]:
    """The metadata carrying [K / GROUP, N] float32 weight scales; keep the list alive."""
    factor = ScaleFactor(scales.ctypes.data, scales.size, 0)  # 0: float32
    pre = PreOp(None, ctypes.pointer(factor), 1, GROUP)
    return PostOp(None, None, None, None, None, 0, None, ctypes.pointer(pre), None, 0), [factor, pre, scales]


def reordered(lib: ctypes.CDLL, packed: np.ndarray, k: int, n: int) -> np.ndarray:
    size = lib.aocl_get_reorder_buf_size_bf16s4f32of32(b"r", b"n", b"B", k, n)
    out = np.empty(size, np.uint8)
    lib.aocl_reorder_bf16s4f32of32(b"r", b"n", b"B", packed.ctypes.data, out.ctypes.data, k, n, n)
    return out


def self_check(lib: ctypes.CDLL) -> None:
    k, n = 256, 32
    packed = np.full((k, n // 2), 0x3D, np.uint8)  # int4 values -3 (low nibble) and 3 (high)
    scales = np.ones((k // GROUP, n), np.float32)
    scales[1] = 2.0
    meta, keep = group_scales(scales)
    a = np.full((2, k), 0x3F80, np.uint16)  # bf16 1.0
    c = np.zeros((2, n), np.float32)
    lib.aocl_gemm_bf16s4f32of32(
        b"r",
        b"n",
        b"n",
        2,
        n,
        k,
        1.0,
        a.ctypes.data,
        k,
        b"n",
        reordered(lib, packed, k, n).ctypes.data,
        n,
        b"r",
        0.0,
        c.ctypes.data,
        n,
        ctypes.byref(meta),
    )
    expected = np.tile([-3.0, 3.0], n // 2) * (GROUP * 1.0 + GROUP * 2.0)
    if not np.array_equal(c[0], expected):
        sys.exit(f"AOCL int4 self-check failed: got {c[0, :4]}, expected {expected[:4]} (API/struct mismatch?)")
    del keep


def aocl_layer_ms(lib: ctypes.CDLL, threads: int) -> float:
    rng = np.random.default_rng(0)

    def expert(k: int, n: int) -> tuple[np.ndarray, PostOp, list[object]]:
        packed = rng.integers(0, 256, size=(k, n // 2), dtype=np.uint8)  # two int4 per byte
        meta, keep = group_scales(rng.random((k // GROUP, n), dtype=np.float32))
        return reordered(lib, packed, k, n), meta, keep

    experts = [(expert(H, 2 * I), expert(I, H)) for _ in range(E)]
    a_in = (rng.standard_normal((threads, M, H)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    a_mid = (rng.standard_normal((threads, M, I)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    c_mid = np.empty((threads, M, 2 * I), np.float32)
    c_out = np.empty((threads, M, H), np.float32)

    def run(worker: int) -> None:
        for e in range(worker, E, threads):
            (gate_up, gate_up_meta, _), (down, down_meta, _) = experts[e]
            lib.aocl_gemm_bf16s4f32of32(
                b"r",
                b"n",
                b"n",
                M,
                2 * I,
                H,
                1.0,
                a_in[worker].ctypes.data,
                H,
                b"n",
                gate_up.ctypes.data,
                2 * I,
                b"r",
                0.0,
                c_mid[worker].ctypes.data,
                2 * I,
                ctypes.byref(gate_up_meta),
            )
            lib.aocl_gemm_bf16s4f32of32(
                b"r",
                b"n",
                b"n",
                M,
                H,
                I,
                1.0,
                a_mid[worker].ctypes.data,
                I,
                b"n",
                down.ctypes.data,
                H,
                b"r",
                0.0,
                c_out[worker].ctypes.data,
                H,
                ctypes.byref(down_meta),
            )

    times = []
    with ThreadPoolExecutor(threads) as pool:  # ctypes releases the GIL during each call
        for _ in range(6):
            started = time.perf_counter()
            list(pool.map(run, range(threads)))
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])


def ktforge_layer_ms(threads: int) -> float:
    import ktforge
    from ktforge import bench

    model = bench.model.models()["qwen3-30b-a3b"]
    gate, up, down = bench.make_weights(model, E)
    moe = ktforge.MoE(E, TOP_K, H, I, method="int4", backend="avx512", threads=threads, group_size=128)
    moe.load_weights(gate, up, down)
    rng = np.random.default_rng(1)
    ids, weights = bench.routing("uniform", T, E, TOP_K, rng)
    x = rng.standard_normal((T, H)).astype(np.float32)
    times = []
    for _ in range(6):
        started = time.perf_counter()
        moe.forward(x, ids, weights)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[1:])


def main() -> None:
    path = os.environ.get("KTFORGE_BLIS_LIBRARY")
    if not path:
        sys.exit("set KTFORGE_BLIS_LIBRARY to an AOCL-BLAS library with aocl_gemm (kt doctor --check blis.addon)")
    lib = load(path)
    self_check(lib)
    threads = len(os.sched_getaffinity(0))
    ops = 2 * T * TOP_K * 3 * H * I
    aocl = aocl_layer_ms(lib, threads)
    ours = ktforge_layer_ms(threads)
    print(f"Qwen3-30B-A3B layer, {T} tokens ({M} per expert), int4, {threads} threads")
    print(f"  AOCL aocl_gemm_bf16s4f32of32 (GEMMs with group scales): {aocl:7.1f} ms  {ops / aocl / 1e6:6.0f} GOP/s")
    print(f"  ktforge avx512 int4 (whole layer, group 128):         {ours:7.1f} ms  {ops / ours / 1e6:6.0f} GOP/s")
    print(f"  ktforge / AOCL speed: {aocl / ours:.2f}x")


if __name__ == "__main__":
    main()
