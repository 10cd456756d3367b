"""The models `kt bench` measures (one MoE layer each, from data/bench_models.toml): their
weights, the routing of their tokens, and how many experts fit in memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ktforge.resources import data_path, load_toml


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int


def models() -> dict[str, Model]:
    raw = load_toml(data_path("bench_models.toml"))
    return {name: Model(name, **fields) for name, fields in raw.items()}


def available_memory() -> int:
    from ktforge.detect.system import memory_available

    return memory_available() or 8 << 30


def activation_bytes_per_token(model: Model) -> int:
    """Memory a token takes in a case: its input (fp32 and the peer's bf16 copy), its k experts'
    gate and up results (fp32), its output (kernels' and peer's)."""
    return 4 * model.hidden * 4 + 2 * model.top_k * model.intermediate * 4


def experts_that_fit(model: Model, budget_bytes: int, copies: int = 1) -> int:
    """bf16 source weights plus ``copies`` packed copies (one per backend timed side by side; bf16,
    the largest) must fit in the budget."""
    per_expert = 3 * model.hidden * model.intermediate * 2 * (1 + copies)
    return max(1, min(model.experts, budget_bytes // per_expert))


def make_weights(model: Model, experts: int, seed: int = 0) -> tuple[Any, Any, Any]:
    """bf16 weights: one random matrix per projection, copied into every expert's own memory
    (the memory traffic is real; generating distinct random numbers for gigabytes is not needed)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    H, I = model.hidden, model.intermediate
    out = []
    for shape in ((I, H), (I, H), (H, I)):
        base = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1])).astype(ml_dtypes.bfloat16)
        full = np.empty((experts, *shape), dtype=ml_dtypes.bfloat16)
        full[:] = base
        out.append(full)
    return out[0], out[1], out[2]


def routing(kind: str, tokens: int, experts: int, top_k: int, rng: np.random.Generator) -> tuple[Any, Any]:
    """ids [T, k] and weights [T, k]. uniform: k distinct experts at random; zipf: k distinct
    experts drawn with probability ~ 1/rank^1.2 (a few hot experts, as in real traffic), the ranks
    given to experts anew at each call: in a model the other layers run between two calls of one,
    so its hot experts come from memory, not from the cache one layer repeated would keep them in."""
    if kind == "uniform":
        ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
    else:
        p = 1.0 / np.arange(1, experts + 1) ** 1.2
        p /= p.sum()
        ranked = rng.permutation(experts)
        ids = ranked[np.stack([rng.choice(experts, size=top_k, replace=False, p=p) for _ in range(tokens)])]
    weights = rng.random((tokens, top_k)).astype(np.float32)
    return ids.astype(np.int64), weights / weights.sum(axis=1, keepdims=True)
