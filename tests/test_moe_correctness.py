"""Every method on every backend this CPU runs, against the NumPy definition, on odd shapes.

Tolerances (relative to the largest output magnitude):
- against `expected` (same quantization as the kernels): 2e-3 for every method; the
  backends agree with each other to 1e-5.
- against the float64 layer: bf16 2e-2, int8 5e-2, int4 (group 32..128) 0.25.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ktforge

from .moe_reference import expected, float_reference

# Every backend every build has (the AMX kernels run on the software tile unit as
# "amx-model" on any AVX-512 CPU), plus the real "amx" where this machine has it.
ALWAYS = ("reference", "avx2", "avx512", "amx-model")
METHODS = ("bf16", "int8", "int4")


def runnable_backends() -> list[str]:
    return [b["name"] for b in ktforge.build_info()["backends"] if b["runs_here"]]


def make_layer(E: int, H: int, I: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    up = (rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32)
    down = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    return gate, up, down


def routing(T: int, E: int, k: int, seed: int = 1) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]) if T else np.zeros((0, k), np.int64)
    weights = rng.random((T, k)).astype(np.float32)
    return ids.astype(np.int64), weights


def rel_err(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-12))


def _host_has_amx() -> bool:
    from .conftest import read_proc_cpuinfo_flags

    return "amx_tile" in read_proc_cpuinfo_flags()


ALL_BACKENDS = ALWAYS + (("amx",) if _host_has_amx() else ())


def test_every_backend_this_build_promises_is_compiled_and_runs_here() -> None:
    info = ktforge.build_info()
    names = [b["name"] for b in info["backends"]]
    assert names[-1] == "reference"
    assert set(ALWAYS) <= set(names)  # the default build compiles every SIMD path and the tile model
    # every machine ktforge is developed and tested on has AVX-512: nothing may be skipped;
    # the real AMX backend runs exactly where the CPU has AMX
    assert set(runnable_backends()) == set(ALL_BACKENDS)


SHAPES = [  # (E, k, H, I, T): H and I not multiples of 16 or 64, E=1, k=E, T=1 and T=1000
    (5, 2, 72, 50, 7),
    (1, 1, 40, 24, 3),
    (3, 3, 24, 40, 1),
    (4, 2, 56, 36, 1000),
    (3, 2, 100, 70, 90),  # >= 16 tokens per expert: the tile kernels' path, with a ragged tail
]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}k{}H{}I{}T{}".format(*s))
def test_matches_the_definition(backend: str, method: str, shape: tuple[int, int, int, int, int]) -> None:
    E, k, H, I, T = shape
    gate, up, down = make_layer(E, H, I)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(2).standard_normal((T, H)).astype(np.float32)
    group = 32 if method == "int4" else 128
    moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group, threads=2)
    moe.load_weights(gate, up, down)
    y = moe.forward(x, ids, w)
    assert y.shape == (T, H) and y.dtype == np.float32
    assert rel_err(y, expected(x, ids, w, gate, up, down, method, group)) < 2e-3
    bound = {"bf16": 2e-2, "int8": 5e-2, "int4": 0.25}[method]
    assert rel_err(y, float_reference(x, ids, w, gate, up, down)) < bound


@pytest.mark.parametrize("method", METHODS)
def test_backends_agree_with_the_reference_backend(method: str) -> None:
    E, k, H, I, T = 6, 3, 88, 72, 120  # enough tokens per expert for the tile kernels
    gate, up, down = make_layer(E, H, I, seed=5)
    ids, w = routing(T, E, k, seed=6)
    x = np.random.default_rng(7).standard_normal((T, H)).astype(np.float32)
    outs = {}
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=64)
        moe.load_weights(gate, up, down)
        outs[backend] = moe.forward(x, ids, w)
    for backend in ALL_BACKENDS[1:]:
        # the GEMMs follow the reference's order and rounding; what differs is silu's exp
        # (a polynomial in the SIMD backends) and fused multiply-adds in the combine
        # (hardware tdpbf16ps rounds fewer times than the SDM's pseudo-code: 1e-3 for "amx" bf16)
        bound = 1e-3 if (backend == "amx" and method == "bf16") else 1e-5
        assert rel_err(outs[backend], outs["reference"].astype(np.float64)) < bound


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_group_sizes(group: int) -> None:
    E, k, H, I, T = 3, 2, 200, 136, 9
    gate, up, down = make_layer(E, H, I, seed=group)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(3).standard_normal((T, H)).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="int4", group_size=group)
    moe.load_weights(gate, up, down)
    assert rel_err(moe.forward(x, ids, w), expected(x, ids, w, gate, up, down, "int4", group)) < 2e-3


def test_bfloat16_in_bfloat16_out() -> None:
    import ml_dtypes

    E, k, H, I, T = 4, 2, 48, 40, 5
    gate, up, down = make_layer(E, H, I)
    bf = ml_dtypes.bfloat16
    ids, w = routing(T, E, k)
    x = np.random.default_rng(4).standard_normal((T, H)).astype(bf)
    moe = ktforge.MoE(E, k, H, I, method="bf16")
    moe.load_weights(gate.astype(bf), up.astype(bf), down.astype(bf))
    y = moe.forward(x, ids, w)
    assert y.dtype == bf
    ref = expected(x.astype(np.float32), ids, w, gate, up, down, "bf16")
    assert rel_err(y.astype(np.float32), ref) < 1e-2  # output rounded to bf16


def test_info_names_backend_kernel_and_threads() -> None:
    moe = ktforge.MoE(2, 1, 32, 32, method="int8", backend="avx512", threads=2)
    info = moe.info
    assert info["name"] == "avx512" and info["method"] == "int8" and info["threads"] == 2
    assert "vpdpbusd" in info["kernel"]
    assert "avx512_vnni" in info["required_cpu_features"]


def test_auto_picks_the_best_backend_this_cpu_runs() -> None:
    assert ktforge.MoE(2, 1, 32, 32).info["name"] == runnable_backends()[0]
