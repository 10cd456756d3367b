"""mxfp8 (OCP MXFP8: FP8 E4M3 codes, an E8M0 power-of-two scale per 32 values of each row) on every
backend this CPU runs, against ml_dtypes' own float8_e4m3fn decoding.

The kernels are fp8's (codes decoded in registers, fp32 FMA on the exact activations; bf16 dot
products for prefill where AVX-512 BF16 runs, the activations rounded to bf16), each group's sums
scaled by its column's E8M0 scale: 1e-4 of the largest output against the float64 layer at decode,
5e-3 on the bf16 prefill path (fp8's bounds).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized, dequantize, quantize

from .. import host
from ..moe_reference import dequantize_mxfp8, float_reference, quantize_mxfp8, rel_err, routing

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
Array = np.ndarray[Any, Any]


def _random_layer(E: int, H: int, I: int, seed: int, scales: tuple[int, int] = (112, 124)) -> list[Quantized]:
    """Random E4M3 codes (no NaN) and E8M0 codes drawn from ``scales``, K not a multiple of 32."""
    rng = np.random.default_rng(seed)
    out = []
    for N, K in ((I, H), (I, H), (H, I)):
        codes = rng.integers(0, 256, (E, N, K), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38  # NaN codes: 1.0
        scale = rng.integers(*scales, (E, N, -(-K // 32)), dtype=np.uint8)
        out.append(Quantized(codes.view(ml_dtypes.float8_e4m3fn), scale))
    return out


def _dense(q: Quantized) -> Array:
    assert q.scale is not None
    return np.stack([dequantize_mxfp8(c, s) for c, s in zip(np.asarray(q.weight), q.scale, strict=True)])


def test_the_packer_quantizes_as_the_definition() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 200)) * 0.02).astype(np.float32)
    w[1] = 0.0  # a zero row: scale 1, codes 0
    w[2, :32] = 448.0 * 2.0**-20  # exactly the top code: no saturation past it
    w[3, 40] = 3e4  # one large value: its group's scale
    codes, e8m0 = quantize_mxfp8(w)
    q = quantize(w, "mxfp8", 32)
    assert q.weight.dtype == ml_dtypes.float8_e4m3fn and q.weight.shape == (48, 200) and q.scale is not None
    assert np.array_equal(q.weight.view(np.uint8), codes.view(np.uint8)) and np.array_equal(q.scale, e8m0)
    assert np.array_equal(dequantize(q, "mxfp8", 200), dequantize_mxfp8(codes, e8m0).astype(np.float32))
    assert not dequantize(q, "mxfp8", 200)[1].any() and q.scale[1].tolist() == [127] * 7
    assert q.scale[2, 0] == 127 - 20 and (np.asarray(q.weight[2, :32]).view(np.uint8) == 0x7E).all()
    assert rel_err(dequantize(q, "mxfp8", 200), w) < 0.07  # E4M3's 3 mantissa bits


@pytest.mark.parametrize("T", [1, 5, 40])  # decode, a few rows, and the prefill tiles (bf16 dots from 16)
def test_every_backend_computes_the_files_values(T: int) -> None:
    E, k, H, I = 4, 2, 136, 72
    layer = _random_layer(E, H, I, seed=T)
    dense = [_dense(q) for q in layer]
    ids, w = routing(T, E, k, seed=T)
    x = np.random.default_rng(T).standard_normal((T, H)).astype(np.float32)
    reference = float_reference(x, ids, w, *dense)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="mxfp8", group_size=32, backend=backend, threads=2)
        moe.load_quantized(*layer)
        prefill = T * k / E >= 16  # bf16 activations where the backend has bf16 dot products
        assert rel_err(moe.forward(x, ids, w), reference) < (5e-3 if prefill else 1e-4), backend


@pytest.mark.parametrize(
    ("scales", "x_scale"), [((0, 3), 2.0**62), ((185, 191), 2.0**-72)], ids=["2^-127-subnormal", "2^63"]
)
def test_the_extreme_scale_codes_are_exact(scales: tuple[int, int], x_scale: float) -> None:
    # gate's E8M0 codes from 0 (2^-127, a subnormal float) or up to 190 (2^63, the largest taken),
    # the activations scaled to keep gate's outputs normal and small; up and down near 1
    E, k, H, I, T = 1, 1, 96, 32, 3
    gate, up, down = _random_layer(E, H, I, seed=2, scales=scales)
    up, down = (Quantized(q.weight, np.full_like(q.scale, 127 - 8)) for q in (up, down))  # type: ignore[arg-type]
    dense = [_dense(q) for q in (gate, up, down)]
    x = np.random.default_rng(1).standard_normal((T, H)).astype(np.float32) * np.float32(x_scale)
    ids, w = np.zeros((T, 1), np.int64), np.ones((T, 1), np.float32)
    reference = float_reference(x, ids, w, *dense)
    assert np.isfinite(reference).all() and np.abs(reference).max() > 0
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="mxfp8", group_size=32, backend=backend)
        moe.load_quantized(gate, up, down)
        assert rel_err(moe.forward(x, ids, w), reference) < 1e-4, backend


def test_bad_codes_and_scales_are_refused_in_one_line() -> None:
    E, k, H, I = 2, 1, 64, 32
    good = _random_layer(E, H, I, seed=9)
    gate = good[0]
    assert gate.scale is not None
    nan = np.asarray(gate.weight).view(np.uint8).copy()
    nan[1, 2, 3] = 0xFF
    cases = [
        (
            Quantized(gate.weight, np.full_like(gate.scale, 255)),
            "not E8M0 codes up to 190",
        ),
        (Quantized(gate.weight, np.full_like(gate.scale, 191)), r"gate\.scale holds values that are not E8M0 codes"),
        (Quantized(nan.view(ml_dtypes.float8_e4m3fn), gate.scale), r"NaN code \(row 2, column 3\)"),
        (Quantized(gate.weight, gate.scale.astype(np.float32)), r"gate\.scale is float32"),
    ]
    moe = ktforge.MoE(E, k, H, I, method="mxfp8")
    for bad, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            moe.load_quantized(bad, good[1], good[2])
        assert "\n" not in str(refused.value)
    moe.load_quantized(*good)
    assert np.isfinite(moe.forward(np.ones((1, H), np.float32), np.zeros((1, 1), np.int64), np.ones((1, 1)))).all()
