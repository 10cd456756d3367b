"""nvfp4 (NVIDIA NVFP4: E2M1 codes, a UE4M3 scale per 16 values, a float32 scale over the tensor)
on every backend this CPU runs, against ml_dtypes' own float4_e2m1fn and float8_e4m3fn decoding.

The kernels look each code up as twice its value (mxfp4's int8 dot products), scale each group's
sums by its UE4M3 scale widened through float16, and the output column by its row's tensor scale:
against the float64 layer over the exact weights with the activations quantized per 16 values,
the bound is 1e-4 (``int8_layer_error``, as for mxfp4).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized, dequantize, quantize

from .. import host
from ..moe_reference import (
    dequantize_nvfp4,
    int8_activations_reference,
    int8_layer_error,
    quantize_nvfp4,
    rel_err,
    routing,
)

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
Array = np.ndarray[Any, Any]
BOUND = 1e-4


def _portable(codes: Array, scale_codes: Array, tensor: Array) -> Quantized:
    """[..., N, Kp] E2M1 codes, [..., N, Kp / 16] UE4M3 codes and [..., N] tensor scales as nvfp4's
    portable layout."""
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    weight = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    return Quantized(weight, scale_codes.astype(np.uint8), global_scale=tensor.astype(np.float32))


def _dense(q: Quantized, K: int) -> Array:
    codes = np.stack([q.weight & 0x0F, q.weight >> 4], axis=-1).reshape(*q.weight.shape[:-1], -1)
    assert q.scale is not None and q.global_scale is not None
    return np.stack([dequantize_nvfp4(c, s, g)[:, :K] for c, s, g in zip(codes, q.scale, q.global_scale, strict=True)])


def _random_layer(E: int, H: int, I: int, seed: int, scales: tuple[int, int] = (0, 127)) -> list[Quantized]:
    """Random codes, UE4M3 codes drawn from ``scales`` (0-126: subnormals, zero and the largest)
    and tensor scales over 2^-14 .. 2^-10 (the largest weights about 1), K not a multiple of 64."""
    rng = np.random.default_rng(seed)
    out = []
    for N, K in ((I, H), (I, H), (H, I)):
        Kp = -(-K // 16) * 16
        codes = rng.integers(0, 16, (E, N, Kp), dtype=np.uint8)
        codes[..., K:] = 0
        scale_codes = rng.integers(*scales, (E, N, Kp // 16), dtype=np.uint8)
        tensor = np.exp2(rng.uniform(-14, -10, (E, 1))) * np.ones((E, N))
        out.append(_portable(codes, scale_codes, tensor))
    return out


def test_the_packer_quantizes_as_modelopt_does_with_each_row_its_tensor() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 200)) * 0.02).astype(np.float32)
    w[1] = 0.0  # a zero row: tensor scale 1, codes 0
    w[2, :16] *= 1e-6  # a group far below its row's largest: a subnormal (or zero) UE4M3 scale
    w[3, 5] = 40.0  # one outlier sets the row's tensor scale
    codes, scale_codes, tensor = quantize_nvfp4(w)
    q = quantize(w, "nvfp4", 16)
    assert q.weight.dtype == np.uint8 and q.weight.shape == (48, 104)
    assert q.scale is not None and q.global_scale is not None
    assert np.array_equal(q.scale, scale_codes) and np.array_equal(q.global_scale, tensor)
    assert np.array_equal(q.weight, _portable(codes, scale_codes, tensor).weight)
    # code * scale exact, times the tensor scale: one rounding to float32
    want = dequantize_nvfp4(codes, scale_codes, tensor)[:, :200].astype(np.float32)
    assert np.array_equal(dequantize(q, "nvfp4", 200), want)
    assert q.global_scale[1] == 1 and not dequantize(q, "nvfp4", 200)[1].any()
    assert (q.scale[2, 0] < 8) and (q.scale <= 0x7E).all()  # a subnormal code; none above 448
    # 4.5 bits a weight, ModelOpt's steps: a relative RMS error within E2M1's
    back = dequantize(q, "nvfp4", 200)
    assert rel_err(back[4:], w[4:]) < 0.2


@pytest.mark.parametrize("T", [1, 5, 40])  # decode, a few rows, and the prefill tiles' path
def test_every_backend_computes_the_files_values(T: int) -> None:
    E, k, H, I = 4, 2, 136, 72  # K not a multiple of 64: a partial group of zeros past 128
    layer = _random_layer(E, H, I, seed=T)
    dense = [_dense(q, K) for q, K in zip(layer, (H, H, I), strict=True)]
    ids, w = routing(T, E, k, seed=T)
    x = np.random.default_rng(T).standard_normal((T, H)).astype(np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=16)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="nvfp4", group_size=16, backend=backend, threads=2)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


def test_every_scale_code_is_its_value() -> None:
    # gate's 127 groups take each UE4M3 code once (0 to 126, subnormals included); up is ones
    E, k, H, I, T = 1, 1, 127 * 16, 32, 3
    rng = np.random.default_rng(4)
    gate_codes = rng.integers(0, 16, (E, I, H), dtype=np.uint8)
    gate = _portable(gate_codes, np.tile(np.arange(127, dtype=np.uint8), (E, I, 1)), np.full((E, I), 2.0**-14))
    up = _portable(np.full((E, I, H), 2, np.uint8), np.full((E, I, 127), 0x38, np.uint8), np.ones((E, I)))
    down_codes = rng.integers(0, 16, (E, H, I), dtype=np.uint8)
    down = _portable(down_codes, np.full((E, H, 2), 0x30, np.uint8), np.full((E, H), 0.75))
    dense = [_dense(q, K) for q, K in zip((gate, up, down), (H, H, I), strict=True)]
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids, w = np.zeros((T, 1), np.int64), np.ones((T, 1), np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=16)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="nvfp4", group_size=16, backend=backend)
        moe.load_quantized(gate, up, down)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_products_sum_exactly(sign: float) -> None:
    # codes +-6 with the largest UE4M3 scale (448) against activations at +-127: the AVX2 path's
    # 16-bit partial sums at their largest, the float16 widening at its top
    E, k, H, I, T = 2, 1, 256, 128, 40
    layer = []
    for N, K in ((I, H), (I, H), (H, I)):
        codes = np.where(np.arange(K) % 3 == 0, 15, 7).astype(np.uint8) * np.ones((E, N, 1), np.uint8)
        layer.append(_portable(codes, np.full((E, N, K // 16), 0x7E, np.uint8), np.full((E, N), 2.0**-16)))
    dense = [_dense(q, K) for q, K in zip(layer, (H, H, I), strict=True)]
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=16)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="nvfp4", group_size=16, backend=backend)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


def test_bad_scales_are_refused_in_one_line_naming_the_part() -> None:
    E, k, H, I = 2, 1, 64, 32
    good = _random_layer(E, H, I, seed=9, scales=(0, 127))
    moe = ktforge.MoE(E, k, H, I, method="nvfp4")
    gate = good[0]
    assert gate.scale is not None and gate.global_scale is not None
    cases = [
        (
            Quantized(gate.weight, np.full_like(gate.scale, 0x7F), global_scale=gate.global_scale),
            r"gate\.scale holds values that are not UE4M3 codes up to 126",
        ),
        (
            Quantized(gate.weight, gate.scale | 0x80, global_scale=gate.global_scale),
            r"gate\.scale holds values that are not UE4M3 codes",
        ),
        (Quantized(gate.weight, gate.scale, global_scale=gate.global_scale * np.nan), r"gate\.global_scale .*finite"),
        (Quantized(gate.weight, gate.scale), r"gate\.global_scale is missing; nvfp4 needs float32"),
        (
            Quantized(gate.weight, gate.scale.astype(np.float32), global_scale=gate.global_scale),
            r"gate\.scale is float32",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            moe.load_quantized(bad, good[1], good[2])
        assert "\n" not in str(refused.value)
    moe.load_quantized(*good)  # nothing was half-loaded: the good layer loads and runs
    assert np.isfinite(moe.forward(np.ones((1, H), np.float32), np.zeros((1, 1), np.int64), np.ones((1, 1)))).all()
