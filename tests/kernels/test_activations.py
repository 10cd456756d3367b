"""The gated activation's variants and per-expert biases, on every backend this CPU runs:
DeepSeek-V4's clamped SwiGLU and gpt-oss's (alpha, limit, up + 1, biases), against a float64
layer written from transformers' own definitions (``_apply_gate`` of DeepseekV4Experts and
GptOssExperts)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ktforge

from .. import host
from ..moe_reference import gated, rel_err, routing
from .test_fp8 import quantized_layer

ALL_BACKENDS = tuple(reversed(host.tested_backends()))
Array = np.ndarray[Any, Any]
GPT_OSS = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "up_offset": 1.0}
DEEPSEEK_V4 = {"swiglu_limit": 10.0}


def reference(
    x: Array, ids: Array, w: Array, layer: list[Array], biases: list[Array | None], act: dict[str, Any]
) -> Array:
    gate, up, down = layer
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t]):
            g, u = gate[e] @ x[t].astype(np.float64), up[e] @ x[t].astype(np.float64)
            if biases[0] is not None:
                g, u = g + biases[0][e], u + biases[1][e]
            d = down[e] @ gated(g, u, **act)
            out[t] += float(w[t, j]) * (d + (biases[2][e] if biases[2] is not None else 0.0))
    return out


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("variant", ["gpt-oss", "deepseek-v4", "plain-with-biases"])
def test_activation_variants_and_biases(backend: str, variant: str) -> None:
    # fp8 weights (exact values) at decode rows (exact activations): fp32 rounding is all that differs
    E, k, H, I, T = 4, 2, 200, 136, 2
    quantized, dense = quantized_layer(E, H, I, seed=4)
    rng = np.random.default_rng(7)
    act = {"gpt-oss": GPT_OSS, "deepseek-v4": DEEPSEEK_V4, "plain-with-biases": {}}[variant]
    biases: list[Array | None] = [None, None, None]
    if variant != "deepseek-v4":
        biases = [
            rng.standard_normal((E, I)).astype(np.float32),
            rng.standard_normal((E, I)).astype(np.float32),
            rng.standard_normal((E, H)).astype(np.float32),
        ]
    ids, w = routing(T, E, k)
    x = (rng.standard_normal((T, H)) * 12).astype(np.float32)  # gate and up values well past the limits
    moe = ktforge.MoE(E, k, H, I, method="fp8", backend=backend, **act)
    moe.load_quantized(*quantized)
    moe.load_biases(*biases)
    want = reference(x, ids, w, dense, [None if b is None else b.astype(np.float64) for b in biases], act)
    assert rel_err(moe.forward(x, ids, w), want) < 1e-4
    if "swiglu_limit" in act:  # the clamp did something here
        g = np.einsum("eih,th->tei", dense[0], x.astype(np.float64))
        assert (g > act["swiglu_limit"]).mean() > 0.1
    # the plain layer is not what was computed (the variant and biases matter)
    plain = reference(x, ids, w, dense, [None, None, None], {})
    assert rel_err(plain, want) > 0.05
    moe.load_biases()  # removed
    if not act:
        assert rel_err(moe.forward(x, ids, w), plain) < 1e-4


def test_bf16_layers_take_the_variant_too() -> None:
    # the activation is the same step for every format: one bf16 check at prefill size
    E, k, H, I, T = 3, 2, 96, 64, 40
    rng = np.random.default_rng(3)
    layer = [(rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32) for s in ((E, I, H), (E, I, H), (E, H, I))]
    biases = [rng.standard_normal(s).astype(np.float32) for s in ((E, I), (E, I), (E, H))]
    ids, w = routing(T, E, k)
    x = (rng.standard_normal((T, H)) * 8).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="bf16", **GPT_OSS)
    moe.load_weights(*layer)
    moe.load_biases(*biases)
    want = reference(x, ids, w, [p.astype(np.float64) for p in layer], [b.astype(np.float64) for b in biases], GPT_OSS)
    assert rel_err(moe.forward(x, ids, w), want) < 2e-2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"swiglu_alpha": 0.0}, "swiglu_alpha must be positive"),
        ({"swiglu_alpha": float("nan")}, "swiglu_alpha must be a finite number"),
        ({"swiglu_limit": -1.0}, r"swiglu_limit must be positive \(or None\)"),
        ({"swiglu_limit": float("inf")}, "swiglu_limit must be a finite number"),
        ({"up_offset": "1"}, "up_offset must be a finite number"),
    ],
)
def test_bad_activation_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ktforge.MoE(2, 1, 32, 16, **settings)


def test_bad_biases_are_refused_by_name() -> None:
    E, H, I = 2, 32, 16
    moe = ktforge.MoE(E, 1, H, I)
    with pytest.raises(ValueError, match=r"up_bias has shape \(2, 32\); expected \(2, 16\)"):
        moe.load_biases(np.zeros((E, I)), np.zeros((E, H)))
    bad = np.zeros((E, H))
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="down_bias contains NaN"):
        moe.load_biases(down=bad)
    with pytest.raises(ValueError, match="gate_bias must be real numbers"):
        moe.load_biases(np.zeros((E, I), np.complex64))
