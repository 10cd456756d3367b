"""Every method on every backend this CPU runs, against the NumPy definition, on odd shapes.

Tolerances (relative to the largest output magnitude):
- against `expected` (same quantization as the kernels): 2e-3 for every method (fp8: 5e-3, its
  prefill rounds activations to bf16 where there are bf16 dot products, `expected` does not);
  the backends agree with each other to 1e-5 (fp8: 5e-3, for the same reason).
- against the float64 layer: bf16 2e-2, int8 and int8g 5e-2, int4 (group 32..128) 0.3, mxfp4
  (E2M1: 1 mantissa bit) 0.6, fp8 (3 mantissa bits) 0.1.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized, dequantize

from .. import host
from ..moe_reference import SHAPES, expected, expected_int8, float_reference, make_layer, rel_err, routing

METHODS = ktforge.formats.names()
# the smallest group each method takes (the most group ends), 128 for those without groups
SMALLEST_GROUP = {m: min(ktforge.formats.by_name(m).group_sizes, default=128) for m in METHODS}
runnable_backends = host.runnable_backends


# Every backend of this build that this CPU runs: the reference, the recipe's SIMD levels
# and the AMX kernels on the software tile unit ("amx-model", any AVX2 CPU), plus the real
# "amx" where the CPU, the OS and Linux's permission allow tiles (under a CPU-feature mask, the
# ones it changes: host.tested_backends).
ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
# and where the others are held to the reference backend's output: it, whatever the mask
WITH_REFERENCE = ("reference", *(b for b in ALL_BACKENDS if b != "reference"))


def test_every_backend_this_build_promises_is_compiled_and_runs_here() -> None:
    names = [b["name"] for b in ktforge.build_info()["backends"]]
    assert names[-1] == "reference"
    # ./install.sh built the recipe the live report recommends, with every backend it lists
    assert host.recipe_backends() <= set(names)
    # the tile model (a host build's: a portable wheel has none) and at least one SIMD level run on
    # every x86-64 machine with AVX2 (unless KTFORGE_DISABLE_CPU_FEATURES hides it: the reference alone)
    avx2 = host.has("avx2", "fma", "f16c")
    simd = {"avx2"} if host.portable_build() else {"amx-model", "avx2"}
    assert ({"reference"} | simd if avx2 else {"reference"}) <= set(runnable_backends())
    # the extension's own CPU check agrees with the probes on what may run here
    assert set(runnable_backends()) == host.backends_the_report_allows()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "E{}k{}H{}I{}T{}".format(*s))
def test_matches_the_definition(backend: str, method: str, shape: tuple[int, int, int, int, int]) -> None:
    E, k, H, I, T = shape
    gate, up, down = make_layer(E, H, I)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(2).standard_normal((T, H)).astype(np.float32)
    group = SMALLEST_GROUP[method]
    moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group, threads=2)
    moe.load_weights(gate, up, down)
    y = moe.forward(x, ids, w)
    assert y.shape == (T, H) and y.dtype == np.float32
    fp8 = method in ("fp8", "mxfp8")  # exact activations, bf16 ones on the bf16-dot prefill path
    assert rel_err(y, expected(x, ids, w, gate, up, down, method, group)) < (5e-3 if fp8 else 2e-3)
    # int4 at group 32: one group a row here; over 40 seeds of these shapes the largest error
    # relative to the largest output was 0.14 at the median and 0.33 at most (0.38 with 15 codes)
    # mxfp4 (one mantissa bit, power-of-two scales): over 75 random layers of these shapes 0.20 at
    # the median and 0.38 at most (int4 at group 32: 0.13 and 0.23); this test's own layer, 0.48
    bound = {
        "bf16": 2e-2,
        "int8": 5e-2,
        "int8g": 5e-2,
        "int4": 0.3,
        "fp8": 0.1,
        "mxfp8": 0.1,
        "mxfp4": 0.6,
        # nvfp4 (E2M1 with FP8 scales per 16): over 5 layers of these shapes 0.16 at the median and
        # 0.40 at most (mxfp4 0.22 and 0.48, int4 at group 32 0.15 and 0.29)
        "nvfp4": 0.5,
        "int4z": 0.3,
        "q4_k": 0.3,
        "q8_0": 5e-2,
        "q6_k": 0.1,
        "q5_k": 0.15,
        "iq4_nl": 0.3,
        "iq4_xs": 0.3,
        # 3 and 2 bits (steps of max|w| / 3 and of the range / 3): over these shapes and 5 layers
        # each, q3_k 0.35 at the median and 0.60 at most, q2_k 0.54 and 1.54 (q4_k: 0.13, 0.25)
        "q3_k": 0.8,
        "q2_k": 2.0,
        # the i-quants, from ktforge's own grid search (no importance matrix): over the same 5
        # layers iq2_xxs 0.53 at the median and 1.11 at most, iq2_xs 0.48 and 1.36, iq3_xxs 0.31
        # and 0.56, iq1_s (1.56 bits a weight) 0.99 and 3.08
        "iq2_xxs": 2.0,
        "iq2_xs": 2.0,
        "iq3_xxs": 0.8,
        "iq1_s": 4.0,
        "q4_0": 0.3,
        "q4_1": 0.3,
        "q5_0": 0.15,
        "q5_1": 0.15,
        "f16": 1e-3,
        "f32": 1e-5,
    }[method]
    assert rel_err(y, float_reference(x, ids, w, gate, up, down)) < bound


@pytest.mark.parametrize("method", METHODS)
def test_backends_agree_with_the_reference_backend(method: str) -> None:
    E, k, H, I, T = 6, 3, 88, 72, 120  # enough tokens per expert for the tile kernels
    gate, up, down = make_layer(E, H, I, seed=5)
    ids, w = routing(T, E, k, seed=6)
    x = np.random.default_rng(7).standard_normal((T, H)).astype(np.float32)
    outs = {}
    for backend in WITH_REFERENCE:
        moe = ktforge.MoE(
            E,
            k,
            H,
            I,
            method=method,
            backend=backend,
            group_size=64 if 64 in ktforge.formats.by_name(method).group_sizes else SMALLEST_GROUP[method],
        )
        moe.load_weights(gate, up, down)
        outs[backend] = moe.forward(x, ids, w)
    for backend in WITH_REFERENCE[1:]:
        # the GEMMs follow the reference's order and rounding; what differs is silu's exp
        # (a polynomial in the SIMD backends) and fused multiply-adds in the combine
        # (hardware tdpbf16ps rounds fewer times than the SDM's pseudo-code: 1e-3 for "amx" bf16)
        # (fp8's prefill rounds activations to bf16 on the backends with bf16 dot products: 5e-3)
        bound = 1e-3 if (backend == "amx" and method == "bf16") else 5e-3 if method in ("fp8", "mxfp8") else 1e-5
        assert rel_err(outs[backend], outs["reference"].astype(np.float64)) < bound


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("group", [32, 128])
def test_int4_at_the_largest_products_sums_exactly(sign: float, group: int) -> None:
    # Every weight at its group's maximum (nibble 15) and every activation at +-127: the
    # largest partial sums the SIMD kernels keep (the AVX2 path sums pmaddubsw pairs in 16
    # bits for a few steps). A wrapped or saturated sum would be far off the definition.
    E, k, H, I, T = 2, 1, 256, 128, 6
    gate = np.full((E, I, H), 0.01, np.float32)
    up, down = gate.copy(), np.full((E, H, I), 0.01, np.float32)
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="int4", backend=backend, group_size=group)
        moe.load_weights(gate, up, down)
        assert rel_err(moe.forward(x, ids, w), expected(x, ids, w, gate, up, down, "int4", group)) < 1e-4, backend


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_int8g_at_the_largest_products_sums_exactly(sign: float) -> None:
    # Codes at both ends (-128 and 127, as load_quantized takes them) against activations at
    # +-127: the largest products of every backend's dot (AVX2 moves the weight's sign onto
    # the activation, |-128| must stay exact; VNNI and the tiles add 128 to each weight).
    E, k, H, I, T, group = 2, 1, 256, 128, 80, 32
    rng = np.random.default_rng(11)
    ends = np.array([-128, 127], np.int8)
    quantized = [
        Quantized(ends[rng.integers(0, 2, (E, N, K))], np.full((E, N, K // group), 0.01, ml_dtypes.bfloat16))
        for N, K in ((I, H), (I, H), (H, I))
    ]
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    outs = {}
    for backend in WITH_REFERENCE:  # 40 tokens per expert: the tile path of "amx-model" too
        moe = ktforge.MoE(E, k, H, I, method="int8g", backend=backend, group_size=group)
        moe.load_quantized(*quantized)
        outs[backend] = moe.forward(x, ids, w)
    # the reference backend's int32 sums are exact; a wrapped or saturated sum elsewhere is far off
    for backend, out in outs.items():
        assert rel_err(out, outs["reference"].astype(np.float64)) < 1e-5, backend
    gate, up, down = (dequantize(q, "int8g", q.weight.shape[-1]) for q in quantized)
    # x is +-1 (its quantization exact); the intermediate activations' int8 rounding remains
    assert rel_err(outs["reference"], float_reference(x, ids, w, gate, up, down)) < 2e-2


def _k_quant_ends(method: str, E: int, N: int, K: int, rng: np.random.Generator) -> Quantized:
    """A projection of a GGUF format (q4_k, q5_k, q6_k, q3_k, q2_k, iq4_nl, iq4_xs, q4_0, q4_1, q5_0,
    q5_1) whose codes, scales (and mins) are each at one of their ends."""
    supers = K // 256
    codes = np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8)[rng.integers(0, 4, (E, N, K // 2))]  # 0 and 15, two a byte
    if method == "q4_k":  # q5_k's records
        return Quantized(codes, _k_quant_ends("q5_k", E, N, K, rng).scale)
    if method in ("q4_0", "q4_1", "q5_0", "q5_1"):  # float16 d (and m) of either sign, a group of 32
        halves = np.array([-1e-3, 1e-3], np.float16)[rng.integers(0, 2, (E, N, K // 32, 2))]
        if method.startswith("q5"):
            codes = np.array([0, 31], np.uint8)[rng.integers(0, 2, (E, N, K))]
        return Quantized(codes, halves if method.endswith("_1") else np.ascontiguousarray(halves[..., 0]))
    if method.startswith("iq4"):  # codes 0 and 15: the grid's -127 and 113
        if method == "iq4_nl":
            return Quantized(codes, np.array([-1e-3, 1e-3], np.float16)[rng.integers(0, 2, (E, N, K // 32))])
        records = np.zeros((E, N, supers, 10), np.uint8)
        records[..., :2] = np.full((E, N, supers, 1), 1e-3, np.float16).view(np.uint8)
        records[..., 2:] = np.array([-32, 31], np.int8).view(np.uint8)[rng.integers(0, 2, (E, N, supers, 8))]
        return Quantized(codes, records)
    if method in ("q6_k", "q3_k"):  # d, then 16 signed scales (q3_k's 6-bit: -32 .. 31)
        ends = [-128, 127] if method == "q6_k" else [-32, 31]
        records = np.zeros((E, N, supers, 18), np.uint8)
        records[..., :2] = np.full((E, N, supers, 1), 1e-3, np.float16).view(np.uint8)
        records[..., 2:] = np.array(ends, np.int8).view(np.uint8)[rng.integers(0, 2, (E, N, supers, 16))]
    else:  # d, dmin, then 8 scales and 8 mins of 6 bits (q2_k: 16 bytes of a 4-bit scale and min)
        records = np.zeros((E, N, supers, 20), np.uint8)
        records[..., :4] = np.full((E, N, supers, 2), 1e-3, np.float16).view(np.uint8)
        ends = [0x00, 0x0F, 0xF0, 0xFF] if method == "q2_k" else [0, 63]
        records[..., 4:] = np.array(ends, np.uint8)[rng.integers(0, len(ends), (E, N, supers, 16))]
    top = {"q6_k": 63, "q3_k": 7, "q2_k": 3}.get(method, 31)
    return Quantized(np.array([0, top], np.uint8)[rng.integers(0, 2, (E, N, K))], records)


@pytest.mark.parametrize("T", [140, 2])  # 70 tokens an expert (tiles too), and decode (1 a expert)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize(
    ("method", "group"),
    [("q4_k", 32), ("q5_k", 32), ("q6_k", 16), ("q3_k", 16), ("q2_k", 16), ("iq4_nl", 32), ("iq4_xs", 32)]
    + [(m, 32) for m in ("q4_0", "q4_1", "q5_0", "q5_1")],
)
def test_k_quants_at_the_largest_products_sum_exactly(method: str, group: int, sign: float, T: int) -> None:
    # Codes at both ends (q5_k: 0 and 31; q6_k: 0 and 63, -32 and 31 times the scale; q3_k: 0 and 7;
    # q2_k: 0 and 3) and scales (and mins) at theirs against activations at +-127: the AVX2 kernel
    # keeps pmaddubsw pairs in 16 bits (q5_k two steps, up to 4 * 2 * 31 * 127; q6_k one, 2 * 2 *
    # 63 * 127; q3_k and q2_k a group's two; the IQ4
    # grid's signed values widen every pair, 2 * 127 * 127), VNNI and the tiles take the offsets
    # off in int32, in the tiles (prefill) and in decode's kernels alike. A wrapped or saturated
    # sum would be far off the reference backend's exact int32 sums.
    E, k, H, I = 2, 1, 512, 256
    rng = np.random.default_rng(12)
    quantized = [_k_quant_ends(method, E, N, K, rng) for N, K in ((I, H), (I, H), (H, I))]
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    outs = {}
    for backend in WITH_REFERENCE:  # at 70 tokens per expert the tile path of "amx-model" too
        moe = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group)
        moe.load_quantized(*quantized)
        outs[backend] = moe.forward(x, ids, w)
    for backend, out in outs.items():
        assert rel_err(out, outs["reference"].astype(np.float64)) < 1e-5, backend
    gate, up, down = (dequantize(q, method, K) for q, K in zip(quantized, (H, H, I), strict=True))
    # x is +-1 (its quantization exact); the intermediate activations' int8 rounding remains (2.3e-2
    # at the IQ4 grid's ends, 3.2e-2 at q3_k's)
    assert rel_err(outs["reference"], float_reference(x, ids, w, gate, up, down)) < 4e-2


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


@pytest.mark.parametrize("backend", [b for b in ALL_BACKENDS if b.startswith(("avx512", "avx2"))])
def test_info_names_backend_kernel_and_threads(backend: str) -> None:
    moe = ktforge.MoE(2, 1, 32, 32, method="int8", backend=backend, threads=2)
    info = moe.info
    assert info["name"] == backend and info["method"] == "int8" and info["threads"] == 2
    # the int8 dot product the CPU has: VNNI where the build and CPU have it, else maddubs
    vnni = backend.startswith("avx512") and "avx512_vnni" in info["required_cpu_features"]
    assert ("vpdpbusd" if vnni else "maddubs") in info["kernel"]
    assert set(info["required_cpu_features"]) <= host.usable_features()


def test_a_backend_this_cpu_cannot_run_is_refused_with_the_reason() -> None:
    compiled = {b["name"] for b in host.build_backends()}
    missing = [b["name"] for b in host.build_backends() if not b["runs_here"]]
    absent = [b for b in ("amx", "avx512", "avx2") if b not in compiled]
    for name in missing:
        with pytest.raises(ValueError, match="needs CPU features this machine lacks"):
            ktforge.MoE(2, 1, 32, 32, method="int8", backend=name)
    for name in absent:
        with pytest.raises(ValueError, match="not compiled into this build"):
            ktforge.MoE(2, 1, 32, 32, method="int8", backend=name)
    assert missing or absent or compiled >= {"amx", "avx512", "avx2"}


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "largest-products"])
@pytest.mark.parametrize("T", [1, 40])  # decode rows, and enough per expert for the tile kernels
def test_int8_weights_of_minus_128_are_exact(backend: str, extreme: bool, T: int) -> None:
    # Third-party symmetric quantizers write -128; the kernels take the whole int8 range. The
    # extreme case: every weight -128 and every activation +-127, the largest pair sums.
    E, k, H, I = 3, 2, 136, 72
    rng = np.random.default_rng(11)
    layer = {}
    for name, (N, K) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
        if extreme:
            q = np.full((E, N, K), -128, np.int8)
        else:
            q = rng.integers(-128, 128, (E, N, K), dtype=np.int8)
            q[rng.random((E, N, K)) < 0.25] = -128
        layer[name] = (q, (rng.random((E, N)) * 1e-3 + 1e-4).astype(np.float32))
    ids, w = routing(T, E, k)
    x = (np.sign(rng.standard_normal((T, H))) if extreme else rng.standard_normal((T, H))).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="int8", backend=backend, threads=2)
    moe.load_quantized(*(Quantized(*layer[p]) for p in ("gate", "up", "down")))
    assert rel_err(moe.forward(x, ids, w), expected_int8(x, ids, w, layer)) < 2e-3


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize(
    ("method", "group", "down", "down_group"),
    [
        ("q4_k", 32, "q8_0", 32),
        ("q4_k", 32, "q6_k", 16),  # Q4_K_M's experts
        ("q5_k", 32, "q6_k", 16),  # Q5_K_M's
        ("q3_k", 16, "q5_k", 32),  # Q3_K_L's
        ("q2_k", 16, "q3_k", 16),  # Q2_K's
        ("q4_k", 32, "f16", 128),  # a GGUF whose down is F16 (or F32)
        ("q8_0", 32, "f32", 128),
        ("q4_0", 32, "q4_1", 32),
        ("q5_0", 32, "q5_1", 32),
        ("q4_k", 32, "bf16", 128),
        ("int4", 64, "int8", 128),
        ("bf16", 128, "q4_k", 32),
        ("int4z", 64, None, 32),  # only the group differs: a tensor-parallel rank's GPTQ act-order down
        ("int8g", 128, None, 64),
    ],
)
def test_down_in_its_own_format_matches_the_definition(
    backend: str, method: str, group: int, down: str | None, down_group: int
) -> None:
    # a GGUF's layer whose down tensor has another type than gate and up (llama.cpp's _M mixes)
    E, k, H, I, T = 5, 2, 264, 136, 90
    gate, up, down_w = make_layer(E, H, I, seed=8)
    ids, w = routing(T, E, k, seed=9)
    x = np.random.default_rng(10).standard_normal((T, H)).astype(np.float32)
    moe = ktforge.MoE(
        E, k, H, I, method=method, group_size=group, down_method=down, down_group_size=down_group, backend=backend
    )
    moe.load_weights(gate, up, down_w)
    down = down or method
    assert (moe.method, moe.down_method, moe.info["down_method"]) == (method, down, down)
    reference = expected(x, ids, w, gate, up, down_w, method, group, down_method=(down, down_group))
    assert rel_err(moe.forward(x, ids, w), reference) < 2e-3


def test_f16_takes_only_weights_within_float16s_range() -> None:
    # load_weights rounds to float16: 65520 and beyond would become infinite, so they are refused;
    # the largest float16, 65504, is kept exactly
    E, k, H, I = 2, 1, 64, 32
    gate, up, down = make_layer(E, H, I)
    moe = ktforge.MoE(E, k, H, I, method="f16")
    big = down.copy()
    big[1, 3, 5] = 65520.0
    with pytest.raises(ValueError, match=r"down holds values beyond float16's range"):
        moe.load_weights(gate, up, big)
    big[1, 3, 5] = 65504.0
    moe.load_weights(gate, up, big)
    x = np.zeros((1, H), np.float32)
    x[0, 0] = 1.0
    assert np.isfinite(moe.forward(x, np.ones((1, 1), np.int64), np.ones((1, 1), np.float32))).all()


def test_a_down_format_is_checked_like_the_layers() -> None:
    with pytest.raises(ValueError, match="down_method must be one of"):
        ktforge.MoE(4, 2, 64, 64, method="int4", group_size=32, down_method="int3")
    with pytest.raises(ValueError, match="down_group_size must be 32"):
        ktforge.MoE(4, 2, 64, 64, method="int4", group_size=64, down_method="q8_0")


@pytest.mark.parametrize("method", ["q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_gguf_parts_are_checked_naming_what_is_wrong(method: str) -> None:
    # a GGUF repack's parts as load_quantized takes them: a wrong dtype (the portable layout's check),
    # codes beyond the format's bits and a d that is not finite (float16 inf; the extension's): each
    # a ValueError naming the part, and the good parts load after them
    E, k, H, I = 2, 1, 256, 256
    rng = np.random.default_rng(13)
    good = [_k_quant_ends(method, E, N, K, rng) for N, K in ((I, H), (I, H), (H, I))]
    moe = ktforge.MoE(E, k, H, I, method=method, group_size=SMALLEST_GROUP[method])

    def load(gate: Quantized) -> None:
        moe.load_quantized(gate, *good[1:])

    with pytest.raises(ValueError, match=rf"gate\.weight is int8 .* {method} .* needs uint8"):
        load(Quantized(good[0].weight.astype(np.int8), good[0].scale))
    legacy = method in ("q4_0", "q4_1", "q5_0", "q5_1")
    scale_dtype = "float16" if legacy else "uint8"
    with pytest.raises(ValueError, match=rf"gate\.scale is float32 .* {method} .* needs {scale_dtype}"):
        load(Quantized(good[0].weight, good[0].scale.astype(np.float32)))
    if method in ("q5_k", "q6_k", "q3_k", "q2_k", "q5_0", "q5_1"):
        codes = good[0].weight.copy()
        top = {"q6_k": 63, "q3_k": 7, "q2_k": 3}.get(method, 31)
        codes[0, 0, 0] = top + 1
        with pytest.raises(ValueError, match=rf"gate holds codes above {top}"):
            load(Quantized(codes, good[0].scale))
    records = good[0].scale.copy()
    if legacy:  # a float16 d (and m) a group
        records[1, 3, 0] = np.inf
    else:  # the record's first float16: d
        records[1, 3, 0, :2] = np.array([np.inf], np.float16).view(np.uint8)
    # legacy scales are checked as float16 values in Python; records' d (and dmin) by the extension
    not_finite = (
        r"gate\.scale holds values that are not finite" if legacy else r"gate_scale holds a d (or dmin )?that is"
    )
    with pytest.raises(ValueError, match=not_finite):
        load(Quantized(good[0].weight, records))
    load(good[0])  # the good parts still load and run
    x = np.ones((3, H), np.float32)
    assert np.isfinite(moe.forward(x, np.zeros((3, 1), np.int64), np.ones((3, 1), np.float32))).all()
