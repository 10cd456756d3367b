"""What the stored-format checkpoint tests share: their inputs, and a checkpoint served on every
backend against the float64 layer with int8 activations (see moe_reference.int8_layer_error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import ktforge

from .. import host
from ..moe_reference import blocks_of, int8_activations_reference, int8_layer_error, routing

BOUND = 1e-4  # fp32 sums against float64 over the same weights and int8 activations


def inputs(T: int, E: int, k: int, H: int) -> tuple[Any, Any, Any]:
    """x [T, H], ids and weights [T, k], seeded by T."""
    ids, w = routing(T, E, k, seed=T)
    return np.random.default_rng(T).standard_normal((T, H)).astype(np.float32), ids, w


def assert_every_backend_serves(path: Path, dense: list[Any], E: int, k: int, H: int, method: str) -> None:
    """Layer 1 of ``path`` runs in ``method`` on every backend this CPU runs, at 2 tokens (decode)
    and 70 (> 32 an expert: the AMX tile kernels' path), on the file's values (``dense``)."""
    for backend in host.tested_backends():
        moe = ktforge.MoE.from_pretrained(path, layer=1, backend=backend)
        assert moe.method == method
        for T in (2, 70):
            x, ids, w = inputs(T, E, k, H)
            got = moe.forward(x, ids, w)
            assert int8_layer_error(got, int8_activations_reference(x, ids, w, *dense, block=blocks_of(moe))) < BOUND, (
                backend,
                T,
            )
