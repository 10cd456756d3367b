"""int4z (asymmetric INT4: GPTQ, AWQ, compressed-tensors' asymmetric schemes) on every backend this
CPU runs: unsigned codes q, a float32 scale and a zero point per group, w = (q - zero) * scale.

The kernels sum q * x in int32 and take zero * sum(x) off per column, exactly; against the float64
layer over the exact weights with int8 activations per token the bound is 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

import ktforge
from ktforge.formats.quantize import Quantized, dequantize

from .. import host
from ..moe_reference import int8_activations_reference, int8_layer_error, rel_err, routing

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
BOUND = 1e-4


def _layer(E: int, H: int, I: int, group: int, seed: int, extreme: bool = False) -> list[Quantized]:
    rng = np.random.default_rng(seed)
    out = []
    for N, K in ((I, H), (I, H), (H, I)):
        Kp = -(-K // group) * group
        codes = np.full((E, N, Kp), 15, np.uint8) if extreme else rng.integers(0, 16, (E, N, Kp), dtype=np.uint8)
        pairs = codes.reshape(E, N, -1, 2)
        zero = (
            np.zeros((E, N, Kp // group), np.uint8)
            if extreme
            else rng.integers(0, 16, (E, N, Kp // group), dtype=np.uint8)
        )
        scale = (rng.random((E, N, Kp // group)) * 0.02 + 0.001).astype(np.float32)
        out.append(Quantized((pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8), scale, zero))
    return out


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("T", [1, 40])  # decode, and the tile kernels' path
def test_every_backend_computes_the_zero_points(group: int, T: int) -> None:
    E, k, H, I = 3, 2, 200, 136  # K not a multiple of the group: padded groups
    layer = _layer(E, H, I, group, seed=T + group)
    dense = [dequantize(q, "int4z", K) for q, K in zip(layer, (H, H, I), strict=True)]
    ids, w = routing(T, E, k, seed=T)
    x = np.random.default_rng(T).standard_normal((T, H)).astype(np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=group)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="int4z", group_size=group, backend=backend, threads=2)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_products_sum_exactly(sign: float) -> None:
    # codes 15 and zero points 0 against activations at +-127: the largest partial sums
    E, k, H, I, T = 2, 1, 256, 128, 40
    layer = _layer(E, H, I, 128, seed=1, extreme=True)
    dense = [dequantize(q, "int4z", K) for q, K in zip(layer, (H, H, I), strict=True)]
    x = np.full((T, H), sign, np.float32)
    ids, w = np.arange(T).reshape(T, 1) % E, np.ones((T, 1), np.float32)
    reference = int8_activations_reference(x, ids, w, *dense, block=128)
    for backend in ALL_BACKENDS:
        moe = ktforge.MoE(E, k, H, I, method="int4z", group_size=128, backend=backend)
        moe.load_quantized(*layer)
        assert int8_layer_error(moe.forward(x, ids, w), reference) < BOUND, backend


def test_bad_zero_points_are_refused() -> None:
    E, k, H, I = 2, 1, 64, 32
    layer = _layer(E, H, I, 32, seed=2)
    moe = ktforge.MoE(E, k, H, I, method="int4z", group_size=32)
    assert layer[0].zero is not None
    high = Quantized(layer[0].weight, layer[0].scale, np.full_like(layer[0].zero, 16))
    with pytest.raises(ValueError, match=r"gate.zero holds zero points above 15"):
        moe.load_quantized(high, layer[1], layer[2])
    with pytest.raises(ValueError, match=r"gate.zero is missing; int4z needs uint8"):
        moe.load_quantized(Quantized(layer[0].weight, layer[0].scale), layer[1], layer[2])


def test_float_weights_pack_on_the_asymmetric_grid() -> None:
    from ..moe_reference import expected, make_layer

    E, k, H, I, T = 3, 2, 96, 64, 9
    gate, up, down = make_layer(E, H, I, seed=4)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(5).standard_normal((T, H)).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="int4z", group_size=32)
    moe.load_weights(gate, up, down)
    assert rel_err(moe.forward(x, ids, w), expected(x, ids, w, gate, up, down, "int4z", 32)) < 2e-3
    with pytest.raises(ValueError, match=r"int4z serves checkpoints' asymmetric INT4 as they are"):
        from ktforge.formats.quantize import quantize

        quantize(gate[0], "int4z", 32)
