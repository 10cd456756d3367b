"""mxfp4 (OCP MXFP4: E2M1 codes, an E8M0 power-of-two scale per 32 values) on every backend this CPU
runs, against ml_dtypes' own float4_e2m1fn decoding.

The kernels look each code up as twice its value (an int8), take int8 dot products with the
activations quantized per token, and halve the result: against the float64 layer over the exact
weights with the activations so quantized, the bound is 1e-4 (fp32 sums; ``int8_layer_error``
forgives 1 token in 50 whose intermediate value rounds to the next int8 step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized, dequantize, quantize

from .. import host
from ..moe_reference import (
    dequantize_mxfp4,
    int8_activations_reference,
    int8_layer_error,
    make_layer,
    quantize_mxfp4,
    routing,
)

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
Array = np.ndarray[Any, Any]
BOUND = 1e-4
PROJECTIONS = ("gate", "up", "down")


def _portable(codes: Array, e8m0: Array) -> Quantized:
    """[..., N, Kp] codes and [..., N, Kp / 32] scale codes as mxfp4's portable layout."""
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return Quantized((pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8), e8m0.astype(np.uint8))


def _random_layer(E: int, H: int, I: int, seed: int, scales: tuple[int, int] = (118, 126)) -> list[Quantized]:
    rng = np.random.default_rng(seed)
    out = []
    for N, K in ((I, H), (I, H), (H, I)):
        Kp = -(-K // 32) * 32
        codes = rng.integers(0, 16, (E, N, Kp), dtype=np.uint8)
        codes[..., K:] = 0
        out.append(_portable(codes, rng.integers(*scales, (E, N, Kp // 32), dtype=np.uint8)))
    return out


def _dense(q: Quantized, K: int) -> Array:
    codes = np.stack([q.weight & 0x0F, q.weight >> 4], axis=-1).reshape(*q.weight.shape[:-1], -1)
    assert q.scale is not None
    return np.stack([dequantize_mxfp4(c, s)[:, :K] for c, s in zip(codes, q.scale, strict=True)])


def test_the_packer_quantizes_as_ml_dtypes_rounds() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 200)).astype(np.float32)
    # every E2M1 midpoint, both signs: ties go to the even code
    w[0, :32] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4, np.float32) * np.repeat([1, -1], 16)
    w[1, :32] = 0.0
    w[2, :32] = 1e-38  # the smallest scales
    codes, e8m0 = quantize_mxfp4(w)
    q = quantize(w, "mxfp4", 32)
    assert q.weight.dtype == np.uint8 and q.weight.shape == (48, 112) and q.scale is not None
    assert np.array_equal(q.scale, e8m0)
    assert np.array_equal(q.weight, _portable(codes, e8m0).weight)
    assert np.array_equal(dequantize(q, "mxfp4", 200), dequantize_mxfp4(codes, e8m0)[:, :200].astype(np.float32))


@pytest.mark.parametrize("T", [1, 5, 40])  # decode, a few rows, and the tile kernels' path
def test_every_backend_computes_the_files_values(T: int) -> None:
    E, k, H, I = 4, 2, 136, 72  # K not a multiple of 64: a partial group of zeros
    layer = _random_layer(E, H, I, seed=T)
    dense = [_dense(q, K) for q, K in zip(layer, (H, H, I), strict=True)]
    ids, w = routing(T, E, k, seed=T)
    x = np.random.default_rng(T).standard_normal((T, H)).astype(np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=32)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32, backend=backend, threads=2)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_products_sum_exactly(sign: float) -> None:
    # every code +-6 (the largest lookup, 12 + 12) against activations at +-127: the AVX2 path's
    # 16-bit partial sums at their largest; a wrapped or saturated sum would be far off
    E, k, H, I, T = 2, 1, 256, 128, 40
    layer = []
    for N, K in ((I, H), (I, H), (H, I)):
        codes = np.where(np.arange(K) % 3 == 0, 15, 7).astype(np.uint8) * np.ones((E, N, 1), np.uint8)
        layer.append(_portable(codes, np.full((E, N, K // 32), 120, np.uint8)))
    dense = [_dense(q, K) for q, K in zip(layer, (H, H, I), strict=True)]
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=32)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32, backend=backend)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


@pytest.mark.parametrize(
    ("scales", "x_scale"),
    [((0, 1, 2), 2.0**100), ((126, 127, 128), 1.0), ((150, 200, 180), 2.0**-76)],
    ids=["2^-127-subnormal", "near-1", "2^73"],
)
def test_scale_codes_from_end_to_end_are_exact(scales: tuple[int, ...], x_scale: float) -> None:
    # E8M0 0 is 2^-127, a subnormal float; activations scaled to keep the layer's values normal
    E, k, H, I, T = 1, 1, 96, 32, 3
    rng = np.random.default_rng(1)
    gate = _portable(rng.integers(0, 16, (E, I, H), dtype=np.uint8), np.tile(np.array(scales, np.uint8), (E, I, 1)))
    up = _portable(rng.integers(0, 16, (E, I, H), dtype=np.uint8), np.full((E, I, 3), 127, np.uint8))
    codes, e8m0 = quantize_mxfp4(np.eye(H, I, dtype=np.float32))  # down: the identity's columns
    down = _portable(codes[None], e8m0[None])
    dense = [_dense(gate, H), _dense(up, H), _dense(down, I)]
    assert np.isfinite(dense[0]).all() and (np.abs(dense[0][dense[0] != 0]) < 2.0**-120).any() == (scales[0] == 0)
    x = (rng.standard_normal((T, H)) * x_scale).astype(np.float32)
    ids, w = np.zeros((T, 1), np.int64), np.ones((T, 1), np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=32)
    assert np.isfinite(reference).all() and np.abs(reference).max() > 0
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32, backend=backend)
        moe.load_quantized(gate, up, down)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


def test_nan_scales_and_other_groups_are_refused() -> None:
    E, k, H, I = 2, 1, 64, 32
    layer = _random_layer(E, H, I, seed=3)
    moe = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32)
    bad = Quantized(layer[0].weight, layer[0].scale.copy())  # type: ignore[union-attr]
    assert bad.scale is not None
    bad.scale[1, 3, 0] = 255
    with pytest.raises(ValueError, match=r"gate.scale holds values that are not E8M0 codes other than 255"):
        moe.load_quantized(bad, layer[1], layer[2])
    with pytest.raises(ValueError, match=r"group_size must be 32, got 64"):
        ktforge.MoE(E, k, H, I, method="mxfp4", group_size=64)
    wrong = Quantized(layer[0].weight, layer[0].scale.astype(np.float32))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"gate.scale is float32"):
        moe.load_quantized(wrong, layer[1], layer[2])


def test_float_weights_quantize_on_load_as_the_portable_path() -> None:
    E, k, H, I, T = 3, 2, 96, 64, 7
    gate, up, down = make_layer(E, H, I, seed=4)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(5).standard_normal((T, H)).astype(np.float32)
    from_floats = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32)
    from_floats.load_weights(gate, up, down)
    portable = ktforge.MoE(E, k, H, I, method="mxfp4", group_size=32)
    portable.load_quantized(*(quantize(p, "mxfp4", 32) for p in (gate, up, down)))
    assert np.array_equal(from_floats.forward(x, ids, w), portable.forward(x, ids, w))


def test_kt_convert_writes_mxfp4_as_from_pretrained_quantizes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ktforge.cli import commands as cli

    from ..synthetic_checkpoints import write_checkpoint

    write_checkpoint(tmp_path / "src", "qwen3_moe", E=4, H=64, I=32)
    args = ["convert", "--input", str(tmp_path / "src"), "--output", str(tmp_path / "out"), "--quant", "mxfp4"]
    result = CliRunner().invoke(cli.app, args)  # no --group-size: mxfp4 has one, 32
    assert result.exit_code == 0, result.output
    converted = ktforge.MoE.from_pretrained(tmp_path / "out", layer=1)
    direct = ktforge.MoE.from_pretrained(tmp_path / "src", layer=1, method="mxfp4")
    assert converted.method == direct.method == "mxfp4" and converted._group == 32
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    ids, w = routing(3, 4, 2)
    assert np.array_equal(converted.forward(x, ids, w), direct.forward(x, ids, w))
