"""int8 activations with a scale per block of K (formats.json's activation_block: the weights'
group, or the super-block where the kernels fold one), held to their scheme at outlier channels:
hidden states with a few channels 20 or 100 times the rest, and a down input whose intermediate
channels are heavy-tailed too. A scale per token, which such a channel sets for the whole row,
fails these tests (the last assertion shows it would, on the same input)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge import formats

from .. import host
from ..conftest import FIXTURES
from ..moe_reference import (
    blocks_of,
    dequantized,
    float_reference,
    int8_activations_reference,
    int8_layer_error,
    rel_err,
    routing,
)

ALL_BACKENDS = tuple(reversed(host.tested_backends()))  # reference first
BLOCKED = [f.name for f in formats.table() if f.activation_block not in (None, "row")]
# each format at its smallest group (per-row int8: any, 128 given); those with several also at 128
# (the AMX tiles' groups)
CASES = [(name, (formats.by_name(name).group_sizes or (128,))[0]) for name in BLOCKED] + [
    (name, 128) for name in BLOCKED if 128 in formats.by_name(name).group_sizes[1:]
]
E, K_TOP, H, I = 2, 1, 1024, 512  # whole super-blocks; x's row is 32 blocks of 32


def outlier_layer(factor: float, seed: int) -> tuple[Any, Any]:
    """Float weights [gate, up, down] whose intermediate activation has 2 channels about ``factor``
    times the rest (their gate and up rows scaled by its square root), and x [70, H] standard normal
    with 4 channels times ``factor``."""
    rng = np.random.default_rng(seed)
    gate, up = ((rng.standard_normal((E, I, H)) / np.sqrt(H)).astype(np.float32) for _ in range(2))
    down = (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32)
    hot = rng.choice(I, 2, replace=False)
    gate[:, hot] *= np.float32(np.sqrt(factor))
    up[:, hot] *= np.float32(np.sqrt(factor))
    x = rng.standard_normal((70, H)).astype(np.float32)
    x[:, rng.choice(H, 4, replace=False)] *= np.float32(factor)
    return (gate, up, down), x


def _frozen(*arrays: Any) -> None:
    for a in arrays:
        a.setflags(write=False)


# The float64 references depend on the format and the input, not on the backend: computed once
# for all backends (half of the kernel tests' time when each backend's case made its own).
@functools.lru_cache(maxsize=4)
def outlier_case(method: str, group: int, factor: float) -> tuple[Any, Any, list[Any]]:
    """outlier_layer's weights and input for ``method``, and the weights the format stores (read-only)."""
    floats, x_all = outlier_layer(factor, seed=len(method))
    dense = [np.stack([dequantized(w, method, group) for w in projection]) for projection in floats]
    _frozen(*floats, x_all, *dense)
    return floats, x_all, dense


@functools.lru_cache(maxsize=32)
def references(method: str, group: int, factor: float, T: int, blocks: tuple[int, int]) -> dict[str, Any]:
    """The first T tokens, their routing, and the layer over the stored weights with exact
    activations ("exact"), int8 activations a scale per ``blocks`` ("blocked") and a scale per token
    ("per_token")."""
    _, x_all, dense = outlier_case(method, group, factor)
    x = x_all[:T]
    ids, w = routing(T, E, K_TOP, seed=T)
    found = {
        "x": x,
        "ids": ids,
        "w": w,
        "exact": float_reference(x, ids, w, *dense),
        "blocked": int8_activations_reference(x, ids, w, *dense, block=blocks),
        "per_token": int8_activations_reference(x, ids, w, *dense, block=(H, I)),
    }
    _frozen(*found.values())
    return found


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize(("method", "group"), CASES)
@pytest.mark.parametrize("factor", [20.0, 100.0])
def test_outlier_channels_cost_only_their_own_blocks(method: str, group: int, backend: str, factor: float) -> None:
    f = formats.by_name(method)
    floats, _, _ = outlier_case(method, group, factor)
    moe = ktforge.MoE(E, K_TOP, H, I, method=method, group_size=group, backend=backend)
    moe.load_weights(*floats)
    block, down_block = blocks_of(moe)
    # at most llama.cpp's (Q8_K: 256); per-row int8 at most 128 (its H and I are multiples of 128 here)
    assert block == {"group": group, "super_block": 256}.get(str(f.activation_block), f.activation_block)
    assert moe.info["activations"] == {
        "gate_up": f"int8, a scale per {block} values of K",
        "down": f"int8, a scale per {down_block} values of K",
    }
    for T in (2, 70):  # decode, and 35 tokens an expert (the prefill kernels; AMX tiles from 32)
        ref = references(method, group, factor, T, (block, down_block))
        y = moe.forward(ref["x"], ref["ids"], ref["w"])
        # the file's weights with exact activations, with the scheme's, with a scale per token
        exact, blocked, per_token = ref["exact"], ref["blocked"], ref["per_token"]
        assert int8_layer_error(y, blocked) < 1e-4, T  # the scheme, computed
        # no further from the exact layer than the scheme itself, and so far closer than a scale
        # per token that one could not pass for the other
        assert rel_err(y, exact) <= 1.02 * rel_err(blocked, exact) + 1e-6, T
        # (blocks of 128 and 256: a 1024-value row's 8 or 4 mostly hold an outlier each; there the
        # scheme is llama.cpp's Q8_K, and scripts/activation_accuracy.py compares at Qwen3's shapes)
        if block <= 32:
            assert rel_err(per_token, exact) > 1.5 * rel_err(y, exact), T


# every format where the kernels have a path of their own for it (the AVX-512 prefill tiles scale
# once at the end) and on the reference; elsewhere, where a token's scale fills each block's slot
# of the per-block kernels, one format of each kind of kernel (int8g's, the nibble tiles', folded)
PER_TOKEN_CASES = [
    (method, backend)
    for backend in ALL_BACKENDS
    for method in BLOCKED
    if backend in ("reference", "avx512") or method in ("int8", "int8g", "q4_0", "q2_k")
]


@pytest.mark.parametrize(("method", "backend"), PER_TOKEN_CASES)
def test_a_scale_per_token_on_request(method: str, backend: str) -> None:
    """MoE(activations="per-token"): one scale a token, the scheme computed, and at outlier
    channels worse than per block."""
    group = (formats.by_name(method).group_sizes or (128,))[0]
    floats, _, _ = outlier_case(method, group, 100.0)
    moe = ktforge.MoE(E, K_TOP, H, I, method=method, group_size=group, backend=backend, activations="per-token")
    moe.load_weights(*floats)
    assert moe.activations == "per-token"
    assert moe.info["activations"] == {"gate_up": "int8, a scale per token", "down": "int8, a scale per token"}
    for T in (2, 70):
        ref = references(method, group, 100.0, T, blocks_of(moe))
        y = moe.forward(ref["x"], ref["ids"], ref["w"])
        # 3e-4: a token's step is set by its outlier, so a value a hair from a rounding boundary moves
        # an output further than per block (the schemes differ by over 1e-2 here)
        assert int8_layer_error(y, ref["per_token"]) < 3e-4, T
        if group <= 32:  # blocks of 256 (Q8_K's: 4 over H here, an outlier in each) gain less than 32's
            gain = 1.25 if formats.by_name(method).activation_block == "super_block" else 1.5
            assert rel_err(y, ref["exact"]) > gain * rel_err(ref["blocked"], ref["exact"]), T


def test_activations_choice_is_checked() -> None:
    with pytest.raises(ValueError, match="activations must be one of per-block, per-token, got 'per-row'"):
        ktforge.MoE(2, 1, 256, 256, method="q4_0", group_size=32, activations="per-row")
    with pytest.raises(ValueError, match="activations='per-token' is for int8 activations; method 'bf16'"):
        ktforge.MoE(2, 1, 256, 256, method="bf16", activations="per-token")
    gguf = FIXTURES / "gguf" / "qwen3moe-Q4_K.gguf"
    moe = ktforge.MoE.from_pretrained(gguf, 0, activations="per-token")
    assert moe.info["activations"]["down"] == "int8, a scale per token"
    with pytest.raises(ValueError, match="activations must be one of"):
        ktforge.MoE.from_pretrained(gguf, 0, activations="token")
