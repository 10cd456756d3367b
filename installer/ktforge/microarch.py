"""Naming the microarchitecture: archspec from the feature set, our model table for the rest.

archspec judges by features (what the kernels can use); the model table
(``data/cpu_models.toml``) knows names archspec lacks (Emerald and Granite Rapids) and
what each model number must and cannot have, which exposes hypervisors that hide
features or mask the model number.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ktforge.resources import data_path, load_toml


@dataclass(frozen=True)
class ModelEntry:
    vendor: str
    family: int
    name: str
    archspec: str
    expects: frozenset[str]
    lacks: frozenset[str]
    models: tuple[tuple[int, int], ...]
    min_stepping: int | None
    max_stepping: int | None

    def matches(self, vendor: str | None, family: int | None, model: int | None, stepping: int | None) -> bool:
        if vendor != self.vendor or family != self.family or model is None:
            return False
        if not any(lo <= model <= hi for lo, hi in self.models):
            return False
        if stepping is not None:
            if self.min_stepping is not None and stepping < self.min_stepping:
                return False
            if self.max_stepping is not None and stepping > self.max_stepping:
                return False
        return True


@functools.cache
def model_table() -> tuple[ModelEntry, ...]:
    raw = load_toml(data_path("cpu_models.toml"))
    entries = []
    for item in raw["model"]:
        ranges = [(m, m) for m in item.get("models", [])]
        ranges += [(lo, hi) for lo, hi in item.get("model_ranges", [])]
        entries.append(
            ModelEntry(
                vendor=item["vendor"],
                family=item["family"],
                name=item["name"],
                archspec=item.get("archspec", item["name"]),
                expects=frozenset(item.get("expects", [])),
                lacks=frozenset(item.get("lacks", [])),
                models=tuple(ranges),
                min_stepping=item.get("min_stepping"),
                max_stepping=item.get("max_stepping"),
            )
        )
    return tuple(entries)


def lookup_model(vendor: str | None, family: int | None, model: int | None, stepping: int | None) -> ModelEntry | None:
    return next((e for e in model_table() if e.matches(vendor, family, model, stepping)), None)


def _archspec_targets() -> dict[str, Any]:
    import archspec.cpu

    return dict(archspec.cpu.TARGETS)


def from_features(arch: str | None, vendor: str | None, features: Iterable[str]) -> dict[str, Any]:
    """archspec's best x86-64 match for ``features``, and the next newer target that almost
    matches (with what it misses): ``{"name", "closest_newer": {"name", "missing"} | None}``."""
    if arch != "x86_64":
        return {"name": arch or "unknown", "closest_newer": None}
    have = set(features)
    if have & {"pni", "ssse3"}:
        have.add("sse3")  # archspec's name for what Linux calls pni
    targets = _archspec_targets()
    x86 = [t for t in targets.values() if t.family.name == "x86_64" and t.vendor in (vendor, "generic")]
    compatible = [t for t in x86 if set(t.features) <= have]
    if not compatible:
        return {"name": "x86_64", "closest_newer": None}
    best = max(compatible, key=lambda t: (len(t.ancestors), t.vendor != "generic"))
    newer = [t for t in x86 if best in t.ancestors and t.vendor == vendor]
    closest = None
    if newer:
        near = min(newer, key=lambda t: (len(set(t.features) - have), len(t.ancestors)))
        missing = sorted(set(near.features) - have)
        if len(missing) <= 3:
            closest = {"name": near.name, "missing": missing}
    return {"name": best.name, "closest_newer": closest}


def identify(
    arch: str | None,
    vendor: str | None,
    family: int | None,
    model: int | None,
    stepping: int | None,
    features: Iterable[str],
) -> dict[str, Any]:
    features = frozenset(features)
    result = from_features(arch, vendor, features)
    entry = lookup_model(vendor, family, model, stepping) if arch == "x86_64" else None
    result["source"] = "archspec"
    result["model_table"] = None
    if entry is None:
        return result
    missing = sorted(entry.expects - features)
    surplus = sorted(entry.lacks & features)
    result["model_table"] = {"name": entry.name, "missing_expected": missing, "unexpected": surplus}
    # Names archspec lacks: use ours when the features agree with the model.
    if entry.name != entry.archspec and result["name"] == entry.archspec and not missing and not surplus:
        result["name"] = entry.name
        result["source"] = "ktforge-table"
    return result
