"""What to do about a failing gate: one table (``data/remedies.toml``) for the build planner
and for ``kt doctor``, so the two never advise different fixes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ktforge.resources import data_path, load_toml


@dataclass(frozen=True)
class Remedy:
    text: str
    commands: tuple[str, ...] = ()


@functools.cache
def table() -> dict[str, Remedy]:
    rows = load_toml(data_path("remedies.toml"))
    return {key: Remedy(row["text"], tuple(row.get("commands", ()))) for key, row in rows.items()}


def remedy(gate: str) -> Remedy:
    """The remedy of a gate (KeyError for a gate the table lacks: a new gate needs its row)."""
    return table()[gate]
