"""What a conversion or a checkpoint holds: a fingerprint of its weights, to check a model against.

Per layer, for every expert and projection, sketches of a few of its rows (first, middle, last):
each row's norm and its dot products with fixed random sign vectors. ``kt convert`` records it;
``ktforge.transformers.load_converted`` and ``load_checkpoint`` compute the same from the model's
own weights and the file's, and refuse where any expert's sketches differ by more than rounding
could explain (2^-6 of the row's norm: bf16 rounding moves a sketch by ~2^-9 of it), e.g. a base
model's conversion loaded into its instruct model, or a file one of whose experts was fine-tuned.
Every expert, not a sample of them: a fine-tune of a few experts leaves the first, middle and last
unchanged. Values are kept to 6 significant digits (a manifest holds E x 3 x 3 x 5 of them a layer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

PROJECTIONS = ("gate", "up", "down")
SKETCHES = 4
TOLERANCE = 2.0**-6
_SEED = 0x6B74_666F  # fixed: the converter and the loader must draw the same signs

Array = np.ndarray[Any, Any]


def sampled(count: int) -> list[int]:
    """The rows sampled out of ``count``: first, middle, last."""
    return sorted({0, count // 2, count - 1})


def _signs(K: int) -> Array:
    return np.random.default_rng(_SEED).choice(np.array([-1.0, 1.0]), size=(SKETCHES, K))


def sketch(rows: Array) -> list[list[float]]:
    """Per row of ``rows`` [R, K]: its norm, then its dot product with each sign vector."""
    values = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    table = np.concatenate([norms, values @ _signs(values.shape[1]).T], axis=1)
    return [[float(f"{v:.6g}") for v in row] for row in table]


def record(experts: int, rows_of: Callable[[int, str], Array]) -> dict[str, Any]:
    """The fingerprint of a layer: ``rows_of(expert, projection)`` gives that projection's
    sampled rows ([len(sampled(N)), K], N and K in Hugging Face orientation), for every expert."""
    return {"experts": experts, "sketch": {p: [sketch(rows_of(e, p)) for e in range(experts)] for p in PROJECTIONS}}


def mismatch(recorded: Mapping[str, Any], experts: int, rows_of: Callable[[int, str], Array]) -> str | None:
    """Why the weights ``rows_of`` gives are not the ones ``recorded`` was made from (None: they
    are, up to rounding)."""
    if isinstance(recorded.get("experts"), list):
        return "its fingerprint is an older kt convert's, of 3 experts only"
    if recorded.get("experts") != experts:
        return f"its fingerprint is of {recorded.get('experts')} experts, not {experts}"
    for projection in PROJECTIONS:
        for expert, theirs in enumerate(recorded["sketch"][projection]):
            ours = np.asarray(sketch(rows_of(expert, projection)))
            theirs = np.asarray(theirs, dtype=np.float64)
            if ours.shape != theirs.shape:
                return f"expert {expert}'s {projection} rows have other sizes"
            scale = np.maximum(ours[:, :1], theirs[:, :1])
            if (np.abs(ours - theirs) > TOLERANCE * scale + 1e-30).any():
                return f"expert {expert}'s {projection} weights differ"
    return None


def valid(recorded: object) -> bool:
    """A fingerprint's structure as ``record`` writes it (a manifest is input: checked first)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("experts"), (int, list)):
        return False
    experts = recorded["experts"]
    sketches = recorded.get("sketch")
    return isinstance(sketches, dict) and all(
        isinstance(sketches.get(p), list)
        and len(sketches[p]) == (len(experts) if isinstance(experts, list) else experts)
        and all(
            isinstance(rows, list)
            and all(isinstance(row, list) and all(isinstance(v, (int, float)) for v in row) for row in rows)
            for rows in sketches[p]
        )
        for p in PROJECTIONS
    )
