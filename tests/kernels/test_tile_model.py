"""The software AMX tile unit against hand-computed cases, and against the real tiles here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ktforge
from ktforge import formats

from .. import host
from .test_fp8 import bf16_dot_rows

ROOT = Path(__file__).resolve().parents[2]

# A C++ check of the model's instructions on cases small enough to compute by hand.
MODEL_TEST = r"""
#define KTFORGE_AMX_MODEL
#include "arch/x86/amx/tile.hpp"
#include <cstdio>
#include <cstring>
using namespace kt;
static int fails = 0;
#define EXPECT(c) do { if (!(c)) { std::printf("FAIL line %d: %s\n", __LINE__, #c); ++fails; } } while (0)
int main() {
  tile::Config cfg;
  cfg.set(0, 2, 8);   // C: 2 rows x 2 int32
  cfg.set(1, 2, 8);   // A: 2 rows x 8 bytes (K = 2 groups of 4)
  cfg.set(2, 2, 8);   // B: 2 rows (K/4) x 2 columns x 4 bytes
  tile::configure(cfg);
  int8_t a[2][8] = {{1, 2, 3, 4, 5, 6, 7, 8}, {-1, -1, -1, -1, 2, 2, 2, 2}};
  int8_t b[2][8] = {{1, 1, 1, 1, 0, 1, 0, 1}, {2, 0, 0, 0, -1, -1, -1, -1}};
  tile::load<1>(a, 8);
  tile::load<2>(b, 8);
  tile::zero<0>();
  tile::dpbssd<0, 1, 2>();
  int32_t c[2][2];
  tile::store<0>(c, 8);
  // c[m][n] = sum_k sum_i a[m][4k+i] * b[k][4n+i]
  EXPECT(c[0][0] == (1+2+3+4) + 2*5);          // 20
  EXPECT(c[0][1] == (2+4) + -(5+6+7+8));       // -20
  EXPECT(c[1][0] == -4 + 4);                   // 0
  EXPECT(c[1][1] == -2 + -8);                  // -10
  tile::dpbssd<0, 1, 2>();                     // accumulates
  tile::store<0>(c, 8);
  EXPECT(c[0][0] == 40 && c[1][1] == -20);
  uint8_t ua[2][8];
  std::memcpy(ua, a, sizeof ua);               // the same bytes read as unsigned: -1 -> 255
  tile::load<1>(ua, 8);
  tile::zero<0>();
  tile::dpbusd<0, 1, 2>();
  tile::store<0>(c, 8);
  EXPECT(c[1][0] == 255 * 4 + 2 * 2);
  tile::zero<0>();
  tile::dpbuud<0, 1, 2>();                     // both unsigned: b's -1 -> 255
  tile::store<0>(c, 8);
  EXPECT(c[0][1] == (2 + 4) + 255 * (5 + 6 + 7 + 8));
  // bf16: C (1x1 fp32) += a0*b0 + a1*b1 with a = (1.5, 2), b = (4, -0.5)
  tile::Config f;
  f.set(0, 1, 4); f.set(1, 1, 4); f.set(2, 1, 4);
  tile::configure(f);
  uint16_t fa[2] = {0x3FC0, 0x4000}, fb[2] = {0x4080, 0xBF00};
  tile::load<1>(fa, 4); tile::load<2>(fb, 4);
  tile::dpbf16ps<0, 1, 2>();
  float r;
  tile::store<0>(&r, 4);
  EXPECT(r == 1.5f * 4.f - 2.f * 0.5f);        // 5
  // rows beyond the configured count are not touched by a store
  int32_t guard[2] = {7, 7};
  tile::store<0>(guard, 64);
  EXPECT(guard[1] == 7);
  tile::release();
  std::printf("%d failures\n", fails);
  return fails != 0;
}
"""


def test_tile_model_instructions_by_hand(tmp_path: Path) -> None:
    source = tmp_path / "tile_model_test.cpp"
    source.write_text(MODEL_TEST)
    binary = tmp_path / "tile_model_test"
    built = subprocess.run(
        ["g++", "-std=c++17", "-O1", f"-I{ROOT / 'native' / 'src'}", str(source), "-o", str(binary)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(binary)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout
    assert "0 failures" in ran.stdout


def simd_peer() -> str:
    """The SIMD level the tile backends hand their non-tile work to here: the best one this CPU
    runs (less what KTFORGE_DISABLE_CPU_FEATURES hides), as their kernels choose it."""
    peer = host.simd_half(host.runnable_backends())
    assert peer is not None, "no SIMD level runs here (the tests that call this need the tile model)"
    return peer


# the tests that run the software tile unit (it needs AVX2: a mask can hide it)
needs_the_model = host.needs_backend("amx-model")


def _layer_inputs(shape: tuple[int, ...], seed: int) -> tuple[Any, ...]:
    """gate, up, down, x, ids and routing weights of a test layer of ``shape`` (E, k, H, I, T)."""
    import numpy as np

    E, k, H, I, T = shape
    rng = np.random.default_rng(seed)
    g, u = (rng.standard_normal((E, I, H)).astype(np.float32) / 10 for _ in range(2))
    d = rng.standard_normal((E, H, I)).astype(np.float32) / 8
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)])
    w = rng.random((T, k)).astype(np.float32)
    return g, u, d, x, ids, w


def _outputs_per_backend(
    method: str, shape: tuple[int, ...], seed: int, group: int = 128, kernels: dict[str, str] | None = None
) -> dict[str, Any]:
    """One layer on the modelled tiles, the best SIMD level this CPU runs (AVX-512, else AVX2)
    and, where this CPU has them, real tiles."""
    E, k, H, I, _ = shape
    g, u, d, x, ids, w = _layer_inputs(shape, seed)
    outs = {}
    backends = ["amx-model", simd_peer()] + (["amx"] if "amx" in host.runnable_backends() else [])
    for backend in backends:
        moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group)
        moe.load_weights(g, u, d)
        outs[backend] = moe.forward(x, ids, w)
        assert moe.info["name"] == backend
        if kernels is not None:
            kernels[backend] = moe.info["kernel"]
        if backend != simd_peer():
            assert {
                "int8": "tdpbssd, a tile flush per activation block",
                "int8g": "tdpbsud",
                "int4": "tdpbssd",
                "int4z": "tdpbsud",
                "fp8": "tdpbf16ps per group",
            }[method] in (moe.info["kernel"])
    return outs


@needs_the_model
def test_real_tiles_and_the_model_agree_bit_for_bit_on_int8() -> None:
    import numpy as np

    outs = _outputs_per_backend("int8", (3, 2, 130, 70, 100), seed=9)
    # int32 tile accumulation is exact: the model, the hardware and the SIMD kernels agree
    np.testing.assert_allclose(outs["amx-model"], outs[simd_peer()], rtol=0, atol=1e-6)
    if "amx" in outs:
        np.testing.assert_array_equal(outs["amx"], outs["amx-model"])


@needs_the_model
@pytest.mark.parametrize(("method", "group"), [(m, g) for m in ("int4", "int8g", "int4z") for g in (64, 128)])
def test_grouped_formats_on_tiles_are_bit_identical_to_avx512(method: str, group: int) -> None:
    import numpy as np

    # 100 tokens per expert: above the grouped formats' tile thresholds
    outs = _outputs_per_backend(method, (3, 2, 200, 72, 150), seed=group, group=group)
    # exact group sums on the tiles, then the AVX-512 kernel's order of scaling: same bits;
    # AVX2 scales in another order: equal to rounding
    if simd_peer().startswith("avx512"):
        for backend in set(outs) - {simd_peer()}:
            np.testing.assert_array_equal(outs[backend], outs[simd_peer()])
    else:
        scale = float(np.abs(outs["avx2"]).max())
        np.testing.assert_allclose(outs["amx-model"], outs["avx2"], rtol=0, atol=1e-5 * scale)


GGUF_AND_MXFP4 = (
    "q8_0",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
    "iq4_xs",
    "q4_k",
    "q5_k",
    "q6_k",
    "mxfp4",
)
SMALL_GROUPS = [(m, 32) for m in ("int4", "int8g", "int4z")] + [
    (m, formats.by_name(m).group_sizes[0]) for m in GGUF_AND_MXFP4
]


@needs_the_model
@pytest.mark.parametrize(("method", "group"), SMALL_GROUPS)
def test_integer_groups_of_32_or_fewer_run_the_simd_kernels_on_the_amx_backends(method: str, group: int) -> None:
    """At groups of 32 or fewer values the tiles' per-group flush costs what they save (measured
    on Sapphire Rapids, native/src/arch/x86/amx/kernels.cpp): prefill there is the SIMD kernels'
    (but q2_k's and q3_k's, whose scales fold into the tiles: above)."""
    import numpy as np

    E, k, H, I, T = 3, 2, 256, 64, 150  # 100 tokens per expert, above every tile threshold
    g, u, d, x, ids, w = _layer_inputs((E, k, H, I, T), seed=group)
    backends = ["amx-model", simd_peer()] + (["amx"] if "amx" in host.runnable_backends() else [])
    outs = {}
    for backend in backends:
        moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group)
        moe.load_weights(g, u, d)
        outs[backend] = moe.forward(x, ids, w)
        if method in ("int4", "int8g", "int4z"):  # tiles from groups of 64: the description says so
            assert backend == simd_peer() or "at groups of 64 or more" in moe.info["kernel"], moe.info["kernel"]
        else:
            assert "tdp" not in moe.info["kernel"] and "amx" not in moe.info["kernel"], moe.info["kernel"]
    # the model runs the best SIMD level this CPU has; the tiles' backend AVX-512
    for backend in set(outs) - {simd_peer()}:
        if backend == "amx-model" or simd_peer().startswith("avx512"):
            np.testing.assert_array_equal(outs[backend], outs[simd_peer()])


@needs_the_model
@pytest.mark.parametrize("group", [32, 128])
def test_fp8_on_tiles_is_the_layer_over_its_values(group: int) -> None:
    import numpy as np

    from ..moe_reference import float_reference, rel_err

    # 100 tokens per expert: tiles (fp8 converted to bf16 B tiles, a flush per group of K)
    kernels: dict[str, str] = {}
    outs = _outputs_per_backend("fp8", (3, 2, 200, 72, 150), seed=group, group=group, kernels=kernels)
    # each path held to the rounding it says it does: a path with bf16 dot products at 100 tokens an
    # expert rounds the activations as the tiles do (equal to rounding); one on fp32 FMA (AVX2,
    # AVX-512 without BF16) takes them exact, 2^-9 of each apart (3e-3 of the largest output on a
    # Zen 3 guest); the layer check below holds the tiles to 1e-3
    scale = float(np.abs(outs["amx-model"]).max())
    for backend in set(outs) - {"amx-model"}:
        rows = bf16_dot_rows(kernels[backend])
        rounds = rows is not None and rows <= 100
        np.testing.assert_allclose(outs["amx-model"], outs[backend], rtol=0, atol=(1e-5 if rounds else 1e-2) * scale)
    # and the layer itself: the float64 MoE over the packed values with bf16 activations
    g, u, d, x, ids, w = _layer_inputs((3, 2, 200, 72, 150), seed=group)
    dense = [_fp8_values(p, group) for p in (g, u, d)]
    assert rel_err(outs["amx-model"], float_reference(x, ids, w, *dense, bf16_experts=range(3))) < 1e-3


def _fp8_values(w: Any, group: int) -> Any:
    """float64 values of weights [E, N, K] as load_weights packs them to fp8 (the definition)."""
    import numpy as np

    from ..moe_reference import dequantize_fp8_blocks, quantize_fp8_blocks

    return np.stack([dequantize_fp8_blocks(*quantize_fp8_blocks(w[e], group), 16, group) for e in range(w.shape[0])])


def test_the_extension_contains_tile_instructions_exactly_when_it_has_the_amx_backend() -> None:
    native = Path(ktforge.__file__).parent
    so = next(
        p
        for loc in (ktforge.__spec__.submodule_search_locations or [])
        if ktforge.__spec__
        for p in Path(loc).glob("_native*.so")
    )
    assert so.exists(), native
    names = [b["name"] for b in ktforge.build_info()["backends"]]
    # ./install.sh builds the recipe the live report recommends: the amx recipe has tiles (a
    # portable build, which scripts/masked_tests.py may use, has them anywhere)
    assert ("amx" in names) is ("amx" in host.recipe_backends())
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True
    ).stdout
    tile_instructions = ("ldtilecfg", "tileloadd", "tdpbf16ps", "tdpbusd", "tdpbssd", "tilestored", "tilerelease")
    present = {i for i in tile_instructions if i in disassembly}
    # the tile model is software: only a build with the amx backend carries tile instructions
    assert present == (set(tile_instructions) if "amx" in names else set())
    assert sys.platform == "linux"


def test_tiles_survive_other_amx_users_in_the_same_thread() -> None:
    # oneDNN (inside torch) configures and releases tiles on the threads ktforge also uses;
    # a kernel that trusted a stale configuration would die with SIGILL: hence a subprocess
    script = (
        "import numpy as np, torch, ktforge\n"
        "torch.set_num_threads(2)\n"
        "a = torch.randn(256, 512, dtype=torch.bfloat16)\n"
        "moe = ktforge.MoE(2, 1, 128, 64, method='bf16', threads=2)\n"
        "rng = np.random.default_rng(0)\n"
        "shapes = ((2, 64, 128), (2, 64, 128), (2, 128, 64))\n"
        "moe.load_weights(*(rng.standard_normal(s).astype(np.float32) for s in shapes))\n"
        "x = rng.standard_normal((64, 128)).astype(np.float32)\n"
        "ids = np.zeros((64, 1), np.int64); w = np.ones((64, 1), np.float32)\n"
        "for _ in range(3):\n"
        "    (a @ a.T).sum()\n"
        "    y = moe.forward(x, ids, w)\n"
        "print('ok', moe.info['name'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok")


@needs_the_model
@pytest.mark.parametrize("method", ["bf16", "int8", "fp8"])
def test_a_second_call_with_the_same_routing_reads_its_own_activations(method: str) -> None:
    # the tile kernels keep a task's gathered rows for the expert's next column slice; a new
    # call, same routing, same buffers, new values must not be served the old rows
    import numpy as np

    E, k, H, I, T = 4, 2, 128, 256, 40  # 20 tokens an expert: the tiles
    g, u, d, x, ids, w = _layer_inputs((E, k, H, I, T), 11)
    backends = ["amx-model"] + (["amx"] if "amx" in host.runnable_backends() else [])
    for backend in backends:
        moe = ktforge.MoE(E, k, H, I, method=method, backend=backend)
        moe.load_weights(g, u, d)
        fresh = ktforge.MoE(E, k, H, I, method=method, backend=backend)
        fresh.load_weights(g, u, d)
        assert "tdp" in moe.info["kernel"], moe.info
        moe.forward(x, ids, w)
        second = (x[::-1] * 0.5).copy()
        np.testing.assert_array_equal(moe.forward(second, ids, w), fresh.forward(second, ids, w))
