"""Expert parallelism: with ``skip_absent``, a slot whose id is -1 (an expert another process holds,
as vLLM's ``expert_map`` marks it) adds nothing, on every backend this CPU runs; without the flag,
and for any other id outside [0, E), the id is refused."""

from __future__ import annotations

import numpy as np
import pytest

import ktforge

from .. import host

E, K, H, I = 6, 3, 64, 96
BACKENDS = tuple(reversed(host.tested_backends()))


def layer(backend: str, method: str) -> ktforge.MoE:
    rng = np.random.default_rng(0)
    moe = ktforge.MoE(E, K, H, I, method=method, backend=backend, threads=2)
    moe.load_weights(
        rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
        rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
        rng.standard_normal((E, H, I)).astype(np.float32) * 0.1,
    )
    return moe


def routed(tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(tokens)]).astype(np.int64)
    weights = rng.uniform(0.1, 1.0, (tokens, K)).astype(np.float32)
    return x, ids, weights


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 5, 70])  # decode, small batch, prefill (the tile kernels)
def test_absent_slots_add_nothing(backend: str, method: str, tokens: int) -> None:
    moe = layer(backend, method)
    x, ids, weights = routed(tokens)
    # this process holds experts 0..2; the others are another rank's
    absent = ids >= 3
    local_ids = np.where(absent, -1, ids)
    out = moe.forward(x, local_ids, weights, skip_absent=True)
    # the same layer over only the present slots: an absent slot is a zero routing weight
    present = moe.forward(x, np.where(absent, 0, ids), np.where(absent, 0.0, weights).astype(np.float32))
    assert np.abs(out - present).max() <= 1e-5 * max(float(np.abs(present).max()), 1e-30)
    # tokens whose every slot is absent get zeros, not the last call's memory
    every_absent = absent.all(axis=1)
    assert np.all(out[every_absent] == 0)
    # and the present experts did contribute: the result is not all zeros
    if not every_absent.all():
        assert np.abs(out[~every_absent]).max() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_slot_absent_gives_zeros(backend: str) -> None:
    moe = layer(backend, "int8")
    x, _, weights = routed(4)
    moe.forward(x, routed(4)[1], weights)  # leave something in the layer's buffers first
    out = moe.forward(x, np.full((4, K), -1, np.int64), weights, skip_absent=True)
    assert out.shape == (4, H) and np.all(out == 0)


def test_minus_one_is_refused_without_the_flag() -> None:
    moe = layer("reference", "int8")
    x, ids, weights = routed(3)
    ids[1, 2] = -1
    with pytest.raises(ValueError, match="expert"):
        moe.forward(x, ids, weights)


@pytest.mark.parametrize("bad", [-2, E, 2**40])
def test_other_ids_outside_the_layer_are_refused_with_the_flag(bad: int) -> None:
    moe = layer("reference", "int8")
    x, ids, weights = routed(3)
    ids[0, 0] = bad
    with pytest.raises(ValueError, match="expert"):
        moe.forward(x, ids, weights, skip_absent=True)
