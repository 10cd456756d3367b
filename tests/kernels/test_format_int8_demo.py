"""The throwaway format int8-demo: int8 under another name, on its own provider."""

from __future__ import annotations

import numpy as np

import ktforge
from ktforge.formats.quantize import quantize


def test_int8_demo_is_int8_on_the_reference_kernels() -> None:
    rng = np.random.default_rng(0)
    E, k, H, I, T = 8, 2, 96, 80, 5
    gate, up = (rng.standard_normal((E, I, H), dtype=np.float32) for _ in range(2))
    down = rng.standard_normal((E, H, I), dtype=np.float32)
    x = rng.standard_normal((T, H), dtype=np.float32)
    ids = rng.integers(0, E, (T, k))
    weights = rng.random((T, k), dtype=np.float32)
    # the best backend for both: the demo's GEMMs run on the reference kernels (integer sums, exact),
    # the rest of the layer (activation quantization, silu, combine) on the backend's
    demo = ktforge.MoE(E, k, H, I, method="int8-demo")
    int8 = ktforge.MoE(E, k, H, I, method="int8")
    for moe in (demo, int8):
        moe.load_weights(gate, up, down)
    expected = int8.forward(x, ids, weights)
    np.testing.assert_allclose(demo.forward(x, ids, weights), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert demo.info["kernel"].startswith("int8-demo: ")
    q, q8 = quantize(gate, "int8-demo"), quantize(gate, "int8")
    np.testing.assert_array_equal(q.weight, q8.weight)
