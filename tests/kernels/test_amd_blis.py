"""The amd-blis backend: AOCL's aocl_gemm for int8/bf16 experts, on the real libraries here
(the aoclda wheel's AOCL-BLAS; Debian's upstream BLIS, which lacks the add-on; none).

AOCL's integer GEMM needs AVX-512 VNNI (Zen 4+, Ice Lake+); its bf16 GEMM also runs on AVX2
(AOCL >= 5.1). Where the CPU lacks VNNI, int8 must be refused with the reason, never run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import ktforge
from ktforge.detect import blis

from .. import host
from ..moe_reference import SHAPES, expected, int8_layer_error, make_layer, rel_err, routing

DEBIAN_BLIS = Path("/usr/lib/x86_64-linux-gnu/libblis.so.4")


@pytest.fixture(scope="module")
def aocl_path() -> str:
    with_addon = [lib for lib in (blis.summarize(c) for c in blis.discover()["candidates"]) if lib["has_addon"]]
    assert with_addon, "AOCL-BLAS with aocl_gemm is required: python -m pip install aoclda"
    return str(with_addon[0]["path"])


AOCL_INT8_RUNS = host.has("avx512_vnni")


@pytest.mark.parametrize("method", ["int8", "bf16", "int4"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}k{}H{}I{}T{}".format(*s))
def test_aocl_path_matches_the_definition(
    method: str, shape: tuple[int, int, int, int, int], aocl_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", aocl_path)
    monkeypatch.setenv("KTFORGE_AOCL_MIN_TOKENS", "1")  # every expert through AOCL, whatever is faster
    E, k, H, I, T = shape
    gate, up, down = make_layer(E, H, I)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(2).standard_normal((T, H)).astype(np.float32)
    if method == "int8" and not AOCL_INT8_RUNS:
        with pytest.raises(
            ValueError, match=r"aocl_gemm_s8s8s32os32 (gives wrong results on this CPU|is refused).*AVX-512 VNNI"
        ):
            ktforge.MoE(E, k, H, I, method=method, backend="amd-blis", group_size=128)
        return
    moe = ktforge.MoE(E, k, H, I, method=method, backend="amd-blis", group_size=128)
    moe.load_weights(gate, up, down)
    info = moe.info
    if method == "int4":
        assert "aocl" not in info  # int4 runs on ktforge's kernels (docs/kernels.md), and says why
        assert info["name"] == "amd-blis" and "aocl_gemm_bf16s4f32of32 measured" in info["kernel"]
    else:
        assert info["name"] == "amd-blis" and info["aocl"]["min_tokens_per_expert"] == 1
        assert info["kernel"].startswith("aocl_gemm_")
    assert rel_err(moe.forward(x, ids, w), expected(x, ids, w, gate, up, down, method, 128)) < 2e-3


@pytest.mark.parametrize("activations", ["per-block", "per-token"])
def test_aocl_int8_takes_the_activation_blocks(
    activations: str, aocl_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-row int8 through AOCL: a GEMM per activation block of K (H 1024: 8 blocks of 128; I 192: 3
    of 64), each block's sums times its scale, the kernels' scheme, at outlier channels (x100)."""
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", aocl_path)
    monkeypatch.setenv("KTFORGE_AOCL_MIN_TOKENS", "1")
    E, k, H, I, T = 3, 2, 1024, 192, 40
    if not AOCL_INT8_RUNS:  # refused with the reason, as above
        with pytest.raises(ValueError, match=r"aocl_gemm_s8s8s32os32 (gives wrong results on this CPU|is refused)"):
            ktforge.MoE(E, k, H, I, method="int8", backend="amd-blis")
        return
    gate, up, down = make_layer(E, H, I)
    x = np.random.default_rng(4).standard_normal((T, H)).astype(np.float32)
    x[:, [3, 300, 700, 1000]] *= 100
    ids, w = routing(T, E, k)
    moe = ktforge.MoE(E, k, H, I, method="int8", backend="amd-blis", activations=activations)
    moe.load_weights(gate, up, down)
    assert moe.info["kernel"].startswith("aocl_gemm_s8s8s32os32")
    kernels = ktforge.MoE(E, k, H, I, method="int8", backend="reference", activations=activations)
    kernels.load_weights(gate, up, down)
    reference = kernels.forward(x, ids, w)
    assert int8_layer_error(moe.forward(x, ids, w), reference.astype(np.float64)) < 1e-4
    if activations == "per-block":  # the scheme the tests/moe_reference.py mirror computes
        assert int8_layer_error(reference, expected(x, ids, w, gate, up, down, "int8").astype(np.float64)) < 1e-4


def test_the_threshold_is_measured_at_load(aocl_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", aocl_path)
    monkeypatch.delenv("KTFORGE_AOCL_MIN_TOKENS", raising=False)
    E, k, H, I, T = 4, 2, 256, 192, 400
    method = "int8" if AOCL_INT8_RUNS else "bf16"
    gate, up, down = make_layer(E, H, I)
    moe = ktforge.MoE(E, k, H, I, method=method, backend="amd-blis")
    moe.load_weights(gate, up, down)
    threshold = moe.info["aocl"]["min_tokens_per_expert"]
    assert threshold is None or threshold in (1, 4, 16, 32, 64, 128, 256)
    assert moe.info["aocl"]["version"].startswith("AOCL-BLAS")
    ids, w = routing(T, E, k)
    x = np.random.default_rng(3).standard_normal((T, H)).astype(np.float32)
    assert rel_err(moe.forward(x, ids, w), expected(x, ids, w, gate, up, down, method)) < 2e-3


def test_upstream_blis_without_the_addon_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEBIAN_BLIS.exists(), "Debian's libblis-dev is required: apt-get install libblis-dev"
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", str(DEBIAN_BLIS))
    for _ in range(2):  # and again: a library refused once is never handed out later (it was, empty: SIGSEGV)
        with pytest.raises(ValueError, match=r"no aocl_gemm add-on.*--with-blis"):
            ktforge.MoE(4, 2, 64, 48, method="int8", backend="amd-blis")


def test_a_missing_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", str(tmp_path / "libblis-mt.so"))
    # the loader's own reason, not "unknown error"
    with pytest.raises(ValueError, match=r"cannot load BLIS library .*: .*No such file"):
        ktforge.MoE(4, 2, 64, 48, method="int8", backend="amd-blis")


def test_a_bad_aocl_threshold_variable_is_named(aocl_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", aocl_path)
    monkeypatch.setenv("KTFORGE_AOCL_MIN_TOKENS", "abc")
    gate, up, down = make_layer(4, 64, 48)
    moe = ktforge.MoE(4, 2, 64, 48, method="bf16", backend="amd-blis")
    with pytest.raises(ValueError, match="KTFORGE_AOCL_MIN_TOKENS must be a positive token count, got 'abc'"):
        moe.load_weights(gate, up, down)


def test_without_a_named_library_the_linked_one_or_the_one_found_here_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KTFORGE_BLIS_LIBRARY", raising=False)
    linked = ktforge.build_info()["blis"]
    if linked:  # an amd-blis build carries its library
        assert ktforge.MoE(4, 2, 64, 48, method="bf16", backend="amd-blis").info["aocl"]["library"] == linked["library"]
    elif found := host.usable_aocl():  # the test environment's aoclda, on a CPU whose GEMMs it computes right
        assert ktforge.MoE(4, 2, 64, 48, method="int8", backend="amd-blis").info["aocl"]["library"] == found
    else:  # refused with the reason: no library found, or the one found (aoclda) is wrong on this CPU
        with pytest.raises(ValueError, match=r"kt build --backend amd-blis|gives wrong results on this CPU|is refused"):
            ktforge.MoE(4, 2, 64, 48, method="int8", backend="amd-blis")


@pytest.mark.parametrize("kind", ["fifo", "directory", "relative"])
def test_a_library_that_is_no_regular_file_is_refused_without_reading_it(
    kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a FIFO would block the loader forever; a relative path would be the working directory's
    target = tmp_path / "libblis-mt.so"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", "./libblis-mt.so" if kind == "relative" else str(target))
    reason = {"fifo": "not a regular file", "directory": "not a regular file", "relative": "not an absolute path"}
    with pytest.raises(ValueError, match=rf"cannot load BLIS library .*: {reason[kind]}"):
        ktforge.MoE(4, 2, 64, 48, method="int8", backend="amd-blis")
