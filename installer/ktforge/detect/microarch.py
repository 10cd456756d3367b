"""Naming the microarchitecture: from vendor, family and model where the table knows them,
else from the features (archspec).

Hypervisors and BIOSes hide flags (KVM's named CPU models drop pku, waitpkg, ...; some
clouds hide AVX-512), so a name judged by features alone falls generations short. The model
table (``data/cpu_models.toml``) names the generation from the model number and says what
it must and cannot have: the name comes from the table unless the features contradict the
model number (a masked model: features it cannot have), and the result lists what the
generation has that this machine does not show (``hidden``) and which of those the kernels
would use. The recipes always judge by the visible features.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

from ktforge.detect.features import REPORTED
from ktforge.detect.report_types import ClosestNewer, Microarchitecture
from ktforge.resources import data_path, load_toml


@dataclass(frozen=True)
class ModelEntry:
    vendor: str
    family: int
    name: str
    archspec: str
    products: str
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
                products=item.get("products", ""),
                expects=frozenset(item.get("expects", [])),
                lacks=frozenset(item.get("lacks", [])),
                models=tuple(ranges),
                min_stepping=item.get("min_stepping"),
                max_stepping=item.get("max_stepping"),
            )
        )
    return tuple(entries)


@functools.cache
def _spellings() -> dict[str, str]:
    spellings: dict[str, str] = load_toml(data_path("cpu_models.toml")).get("spelled", {})
    return spellings


def spelled(name: str, article: bool = False) -> str:
    """``name`` as people write it ("emeraldrapids": "Emerald Rapids"), with "a" or "an" before it
    on request ("an Emerald Rapids", "a Zen 4")."""
    text = _spellings().get(name, name)
    if not article:
        return str(text)
    return f"{'an' if text[:1].lower() in 'aeiou' or text.startswith('x86') else 'a'} {text}"


def lookup_model(vendor: str | None, family: int | None, model: int | None, stepping: int | None) -> ModelEntry | None:
    return next((e for e in model_table() if e.matches(vendor, family, model, stepping)), None)


def _archspec_targets() -> dict[str, Any]:
    import archspec.cpu

    return dict(archspec.cpu.TARGETS)


class FeatureMatch(TypedDict):
    name: str
    closest_newer: ClosestNewer | None


def from_features(arch: str | None, vendor: str | None, features: Iterable[str]) -> FeatureMatch:
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
    closest: ClosestNewer | None = None
    if newer:
        near = min(newer, key=lambda t: (len(set(t.features) - have), len(t.ancestors)))
        missing = sorted(set(near.features) - have)
        if len(missing) <= 3:
            closest = {"name": near.name, "missing": missing}
    return {"name": best.name, "closest_newer": closest}


def _target_features(name: str) -> frozenset[str]:
    target = _archspec_targets().get(name)
    return frozenset(target.features) if target is not None else frozenset()


def identify(
    arch: str | None,
    vendor: str | None,
    family: int | None,
    model: int | None,
    stepping: int | None,
    features: Iterable[str],
) -> Microarchitecture:
    """``name`` (the generation), ``source`` (model-table or archspec), ``by_features``
    (archspec's name for the visible flags), ``hidden`` (what the generation has that is not
    visible), ``hidden_used_by_kernels``, ``products``, ``closest_newer`` and ``model_table``."""
    features = frozenset(features)
    match = from_features(arch, vendor, features)
    result: Microarchitecture = {
        "name": match["name"],
        "closest_newer": match["closest_newer"],
        "source": "archspec",
        "by_features": match["name"],
        "hidden": [],
        "hidden_used_by_kernels": [],
        "products": None,
        "model_table": None,
    }
    entry = lookup_model(vendor, family, model, stepping) if arch == "x86_64" else None
    if entry is None:
        return result
    missing = sorted(entry.expects - features)
    surplus = sorted(entry.lacks & features)
    result["model_table"] = {"name": entry.name, "missing_expected": missing, "unexpected": surplus}
    if surplus:  # the model number cannot be right: a hypervisor masks it; trust the features
        return result
    have = set(features) | ({"sse3"} if features & {"pni", "ssse3"} else set())
    hidden = sorted(_target_features(entry.archspec) - have)
    result["name"] = entry.name
    result["source"] = "model-table"
    result["products"] = entry.products or None
    result["hidden"] = hidden
    result["hidden_used_by_kernels"] = sorted(set(hidden) & set(REPORTED))
    result["closest_newer"] = None
    return result
