"""`kt bench`'s options, each checked before anything is measured."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ktforge import formats
from ktforge.bench import model as catalog
from ktforge.bench.model import activation_bytes_per_token, available_memory, experts_that_fit
from ktforge.kernels import ACTIVATIONS, MAX_THREADS

DEFAULT_TOKENS = (1, 4, 16, 64, 128, 512, 2048)


DECODE_MAX_TOKENS = 64  # below: a fresh routing every call (weights stream from memory), 4x the runs


METHODS = formats.names()


ROUTINGS = ("uniform", "zipf")


@dataclass(frozen=True)
class BenchOptions:
    """What a run measures: every value checked (:func:`check_options`)."""

    models: tuple[str, ...]
    methods: tuple[str, ...]
    backends: tuple[str, ...]
    tokens: tuple[int, ...]
    routings: tuple[str, ...]
    threads: tuple[int, ...]
    repeats: int
    peer: bool
    budget_gib: float | None
    group_size: int = 128  # of the grouped methods (int8g, int4)
    activations: str = "per-block"  # MoE(activations=...) of the methods with int8 activations


def check_options(
    model_names: list[str],
    methods: list[str],
    token_text: list[str],
    routings: list[str],
    thread_text: list[str],
    repeats: int,
    budget_gib: float | None,
    peer: bool = True,
    group_size: int = 128,
    activations: str = "per-block",
) -> BenchOptions:
    """Every option value checked before anything is measured (the backends are the CLI's to
    choose, from what this build runs). Raises ValueError naming the option, the value and what
    is accepted."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--method: {', '.join(bad) or 'none given'}; choose from {', '.join(METHODS)}")
    for m in methods:
        formats.check_group(m, formats.group_for(m, group_size), "--group-size")
    if activations not in ACTIVATIONS:
        raise ValueError(f"--activations: {activations!r}; choose from {', '.join(ACTIVATIONS)}")
    bad = [r for r in routings if r not in ROUTINGS]
    if bad or not routings:
        raise ValueError(f"--routing: {', '.join(bad) or 'none given'}; choose from {', '.join(ROUTINGS)}")
    try:
        tokens = [int(t) for t in token_text] if token_text else list(DEFAULT_TOKENS)
    except ValueError:
        raise ValueError(f"--tokens: {','.join(token_text)!r} is not a list of token counts (e.g. 1,4,128)") from None
    if not tokens or any(t < 1 or t > 1 << 20 for t in tokens):
        raise ValueError(f"--tokens: counts from 1 to {1 << 20}, got {','.join(token_text) or 'none'}")
    if repeats < 1:
        raise ValueError(f"--repeats: at least 1, got {repeats}")
    try:
        threads = [int(t) for t in thread_text]
    except ValueError:
        raise ValueError(f"--threads: {','.join(thread_text)!r} is not a list of thread counts (e.g. 1,2)") from None
    if any(t < 1 or t > MAX_THREADS for t in threads):
        raise ValueError(f"--threads: at least 1 and at most {MAX_THREADS}, got {','.join(thread_text)}")
    _check_memory(model_names, tokens, budget_gib)
    return BenchOptions(
        tuple(model_names),
        tuple(methods),
        (),
        tuple(tokens),
        tuple(routings),
        tuple(threads or [len(os.sched_getaffinity(0))]),
        repeats,
        peer,
        budget_gib,
        group_size,
        activations,
    )


def _check_memory(model_names: list[str], tokens: list[int], budget_gib: float | None) -> None:
    available = available_memory()
    for name in model_names:  # the largest case's activations (inputs, gate/up results, outputs)
        activations = max(tokens) * activation_bytes_per_token(catalog.models()[name])
        if activations > available // 2:
            raise ValueError(
                f"--tokens {max(tokens)}: {name}'s activations take about {activations / (1 << 30):.1f} GiB, "
                f"over half of the {available / (1 << 30):.1f} GiB available; give fewer tokens"
            )
    if budget_gib is not None:
        if not (math.isfinite(budget_gib) and budget_gib > 0):
            raise ValueError(f"--max-weight-gib: a positive size, got {budget_gib}")
        if budget_gib * (1 << 30) > available:
            raise ValueError(
                f"--max-weight-gib {budget_gib}: more than the {available / (1 << 30):.1f} GiB available; give less"
            )
        for name in model_names:
            model = catalog.models()[name]
            if experts_that_fit(model, int(budget_gib * (1 << 30))) < model.top_k:
                need = model.top_k * 3 * model.hidden * model.intermediate * 4 / (1 << 30)
                raise ValueError(
                    f"--max-weight-gib {budget_gib} holds fewer than the {model.top_k} experts one token of {name} "
                    f"routes to; give at least {need:.2f}"
                )
