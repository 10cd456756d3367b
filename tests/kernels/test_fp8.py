"""fp8: FP8 E4M3 weights with float32 block (or channel) scales, on every backend this CPU runs.

The kernels take a code's bits straight into a float's (times 2^-120) and compute in fp32 with
exact fp32 activations, so the layer agrees with a float64 MoE over the dequantized weights to
fp32 rounding: bound 1e-4 of the largest output. Prefill on bf16 dot products (AVX-512 BF16 from
16 tokens an expert, AMX tiles from 32) rounds the activations to bf16: there the bound is 1e-3
against the float64 layer with the same roundings (``float_reference(bf16_experts=...)``), and
5e-3 against exact activations. Dequantization here is torch's own (``torch.float8_e4m3fn`` to
float32), not ours.
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized

from .. import host
from ..moe_reference import (
    dequantize_fp8_blocks,
    expected,
    float_reference,
    make_layer,
    quantize_fp8_blocks,
    rel_err,
    routing,
)

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
Array = np.ndarray[Any, Any]
BOUND = 1e-4  # fp32 sums against float64 over the same weights
BF16_ACTIVATIONS_BOUND = 5e-3  # what rounding the activations to bf16 costs, at most
# against the float64 layer with the same bf16 roundings: the kernels' fp32 intermediate
# activation may round to the bf16 neighbour of the float64 one's (2^-8 of that value)
BF16_ROUNDED_BOUND = 1e-3


def bf16_dot_rows(kernel: str) -> int | None:
    """From how many tokens an expert a layer's kernels (its ``info["kernel"]``) take bf16 dot
    products, rounding activations to bf16; None: never."""
    counts = [
        int(n) for part in kernel.split(", else ") if "bf16ps" in part for n in re.findall(r">= (\d+) tokens", part)
    ]
    return min(counts) if counts else None


def assert_the_layer(moe: ktforge.MoE, x: Array, ids: Array, w: Array, dense: list[Array]) -> None:
    """The layer's output is the float64 layer over ``dense`` with each expert's activations as
    its kernel takes them: exact (to 1e-4), or rounded to bf16 where it has enough tokens for bf16
    dot products (to 1e-3; and to 5e-3 of the layer with exact activations)."""
    y = moe.forward(x, ids, w)
    rows = bf16_dot_rows(moe.info["kernel"])
    counts = np.bincount(ids.ravel(), minlength=moe.num_experts)
    bf16 = {e for e in range(moe.num_experts) if rows is not None and counts[e] >= rows}
    assert rel_err(y, float_reference(x, ids, w, *dense, bf16_experts=bf16)) < (BF16_ROUNDED_BOUND if bf16 else BOUND)
    assert rel_err(y, float_reference(x, ids, w, *dense)) < (BF16_ACTIVATIONS_BOUND if bf16 else BOUND)


def torch_dequantize(codes: Array) -> Array:
    """float32 values of E4M3 codes by torch's own conversion."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(codes).view(np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def per_row(scale: Array, rows: int, N: int) -> Array:
    """Block scales [.., N / rows, G] repeated over their rows: load_quantized's layout."""
    return np.ascontiguousarray(np.repeat(scale, rows, axis=-2)[..., :N, :], dtype=np.float32)


def fp8_quantized(w: Array) -> Quantized:
    """Experts' weights [E, N, K] as FP8 codes with 16 x 128 block scales, in load_quantized's
    layout (the definition's quantizer: ml_dtypes' cast)."""
    parts = [quantize_fp8_blocks(w[e]) for e in range(w.shape[0])]
    return Quantized(np.stack([c for c, _ in parts]), per_row(np.stack([s for _, s in parts]), 16, w.shape[1]))


def quantized_layer(E: int, H: int, I: int, seed: int) -> tuple[list[Quantized], list[Array]]:
    """A layer's experts as fp8_quantized gives them, and the float64 weights they stand for
    (torch's decoding)."""
    quantized = [fp8_quantized(w) for w in make_layer(E, H, I, seed=seed)]
    dense = [
        torch_dequantize(q.weight).astype(np.float64) * np.repeat(q.scale, 128, axis=-1)[..., : q.weight.shape[2]]
        for q in quantized
    ]
    return quantized, dense


@pytest.mark.parametrize("backend", ALL_BACKENDS)
# decode rows, a ragged tile, 30 and 100 rows an expert (the bf16-dot prefill on AVX-512 BF16 and AMX)
@pytest.mark.parametrize("T", [1, 2, 5, 60, 200])
def test_fp8_layer_is_the_float64_layer_over_torchs_dequantization(backend: str, T: int) -> None:
    E, k, H, I = 4, 2, 200, 136  # K neither a whole group nor a multiple of 16
    quantized, dense = quantized_layer(E, H, I, seed=3)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(4).standard_normal((T, H)).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="fp8", backend=backend, threads=2)
    moe.load_quantized(*quantized)
    assert_the_layer(moe, x, ids, w, dense)
    # bf16 dot products (rounded activations) exactly where the backend has them: the tiles (or
    # their model) and an AVX-512 level compiled with BF16; elsewhere exact activations at every count
    bf16_dots = backend.startswith("amx") or "avx512_bf16" in moe.info["required_cpu_features"]
    assert (bf16_dot_rows(moe.info["kernel"]) is not None) is bf16_dots, moe.info["kernel"]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_load_weights_quantizes_as_ml_dtypes_rounds(backend: str) -> None:
    # load_weights' own quantizer (16 x 128 blocks, max|w| / 448, round to nearest even) gives
    # the same codes as ml_dtypes' float8_e4m3fn cast: both loads compute bit-identical outputs.
    # Each block holds 448 (scale 1) and values on the ties between codes, in the subnormals
    # and below the smallest of them.
    E, k, H, I, T = 2, 1, 256, 32, 3
    rng = np.random.default_rng(8)
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    finite = np.sort(np.unique(np.abs(codes[np.isfinite(codes)])))
    ties = (finite[:-1] + finite[1:]) / 2  # exactly halfway: round to the even code
    special = np.concatenate([finite, ties, [2.0**-10, 2.0**-11, 2.0**-12, 3 * 2.0**-11]]).astype(np.float32)

    def layer(N: int, K: int) -> Array:
        values = rng.choice(special, (E, N, K)) * rng.choice([-1.0, 1.0], (E, N, K))
        values[:, ::16, ::128] = 448.0  # every 16 x 128 block's largest |w|
        return (values * 2.0**-12).astype(np.float32)  # scale 2^-12: w / scale as exact as w

    gate, up, down = layer(I, H), layer(I, H), layer(H, I)
    ids, w = routing(T, E, k)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ours = ktforge.MoE(E, k, H, I, method="fp8", backend=backend)
    ours.load_weights(gate, up, down)
    theirs = ktforge.MoE(E, k, H, I, method="fp8", backend=backend)
    quantized = [fp8_quantized(p) for p in (gate, up, down)]
    assert all((q.scale == 2.0**-12).all() for q in quantized)
    theirs.load_quantized(*quantized)
    np.testing.assert_array_equal(ours.forward(x, ids, w), theirs.forward(x, ids, w))
    # and both are the definition's layer (3 rows: the exact fp32 path everywhere)
    assert rel_err(ours.forward(x, ids, w), expected(x, ids, w, gate, up, down, "fp8")) < BOUND


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_every_code_decodes_exactly(backend: str) -> None:
    # All 254 finite codes (both zeros, the 14 subnormals, +-448) in every projection, with
    # channel scales (one per row) and block scales mixed over the 16-row blocks
    E, k, H, I, T = 2, 2, 256, 64, 4
    rng = np.random.default_rng(9)
    finite = np.array([c for c in range(256) if (c & 0x7F) != 0x7F], np.uint8)
    quantized, dense = [], []
    for N, K in ((I, H), (I, H), (H, I)):
        codes = rng.choice(finite, (E, N, K))
        codes.reshape(E, -1)[:, : finite.size] = finite
        G = -(-K // 128)
        block = np.repeat(rng.uniform(1e-3, 2e-3, (E, -(-N // 16), G)).astype(np.float32), 16, axis=1)[:, :N]
        channel = np.repeat(rng.uniform(1e-3, 2e-3, (E, N, 1)).astype(np.float32), G, axis=2)
        rows16 = (np.arange(N) // 16 % 2 == 0)[None, :, None]
        scale = np.ascontiguousarray(np.where(rows16, block, channel))
        quantized.append(Quantized(codes.view(ml_dtypes.float8_e4m3fn), scale))
        dense.append(torch_dequantize(codes).astype(np.float64) * np.repeat(scale, 128, axis=-1)[..., :K])
    ids, w = routing(T, E, k)
    x = rng.standard_normal((T, H)).astype(np.float32) * 30
    moe = ktforge.MoE(E, k, H, I, method="fp8", backend=backend)
    moe.load_quantized(*quantized)
    assert_the_layer(moe, x, ids, w, dense)
    ids, w = routing(80, E, k)  # 80 rows an expert: every prefill path
    x = rng.standard_normal((80, H)).astype(np.float32)
    assert_the_layer(moe, x, ids, w, dense)


def test_fp8_weights_take_a_byte_each() -> None:
    E, H, I = 4, 256, 128
    quantized, _ = quantized_layer(E, H, I, seed=1)
    moe = ktforge.MoE(E, 2, H, I, method="fp8")
    moe.load_quantized(*quantized)
    # the codes and a float32 block scale per 16 x 128 (no row scales: all are 1); gate and up
    # packed as one matrix [2I, H], down [H, I]
    per_expert = sum(N * K + 4 * (N // 16) * (K // 128) for N, K in ((2 * I, H), (H, I)))
    assert moe.info["packed_bytes"] == E * per_expert
    assert moe.info["packed_bytes"] / (3 * E * H * I) == 1 + 4 / (16 * 128)


def test_bad_fp8_weights_are_refused_by_name() -> None:
    E, k, H, I = 2, 1, 256, 32  # two groups along H
    quantized, _ = quantized_layer(E, H, I, seed=2)
    moe = ktforge.MoE(E, k, H, I, method="fp8")
    gate, up, down = quantized
    nan = gate.weight.view(np.uint8).copy()
    nan[1, 5, 7] = 0x7F
    with pytest.raises(ValueError, match=r"NaN code \(row 5, column 7\)"):
        moe.load_quantized(Quantized(nan.view(ml_dtypes.float8_e4m3fn), gate.scale), up, down)
    mixed = gate.scale.copy()
    mixed[0, 3, 0] *= 2  # neither one scale per block nor one per row
    with pytest.raises(ValueError, match="vary both along K and between rows"):
        moe.load_quantized(Quantized(gate.weight, mixed), up, down)
    with pytest.raises(ValueError, match="not finite"):
        moe.load_quantized(Quantized(gate.weight, np.full_like(gate.scale, np.inf)), up, down)
    with pytest.raises(ValueError, match=r"gate.scale is float32 \(2, 32, 3\); fp8 with group size 128 needs"):
        moe.load_quantized(Quantized(gate.weight, np.ones((E, I, 3), np.float32)), up, down)
    with pytest.raises(ValueError, match=r"gate\.weight is uint8"):
        moe.load_quantized(Quantized(gate.weight.view(np.uint8), gate.scale), up, down)
    with pytest.raises(ValueError, match="group_size must be 32, 64 or 128, got 48"):
        ktforge.MoE(E, k, H, I, method="fp8", group_size=48)
    with pytest.raises(RuntimeError, match="before load_weights"):
        moe.forward(np.zeros((1, H), np.float32), np.zeros((1, k), np.int64), np.ones((1, k), np.float32))


@pytest.mark.parametrize("value", [np.nan, np.inf, 2.0**64])
def test_activations_fp8_cannot_scale_are_refused(value: float) -> None:
    # the kernels hold x times 2^64 in fp32: 2^64 and beyond would overflow
    E, k, H, I = 2, 1, 128, 32
    gate, up, down = make_layer(E, H, I)
    moe = ktforge.MoE(E, k, H, I, method="fp8")
    moe.load_weights(gate, up, down)
    x = np.ones((2, H), np.float32)
    x[1, 3] = value
    with pytest.raises(ValueError, match=r"x contains NaN or infinite values.*2\^64.*\(row 1\)"):
        moe.forward(x, np.zeros((2, k), np.int64), np.ones((2, k), np.float32))


def test_a_quantized_fp8_layer_is_close_to_the_float_layer() -> None:
    # what FP8's 3 mantissa bits cost against the unquantized weights (not the kernels' error)
    E, k, H, I, T = 4, 2, 256, 128, 16
    gate, up, down = make_layer(E, H, I, seed=6)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(5).standard_normal((T, H)).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="fp8")
    moe.load_weights(gate, up, down)
    err = rel_err(moe.forward(x, ids, w), float_reference(x, ids, w, gate, up, down))
    assert 1e-3 < err < 0.1
    weights = dequantize_fp8_blocks(*quantize_fp8_blocks(gate[0]), 16, 128)
    assert 0.01 < np.sqrt(((weights - gate[0]) ** 2).mean() / (gate[0] ** 2).mean()) < 0.04
