"""Recipes (``recipes/*.toml``) and the choice of backend, with why each other one was not chosen.

Each precondition ("gate") evaluates to pass, fail or unknown. Unknown happens when
the evidence cannot tell (a text dump carries no XCR0 or permission answer). A CPU or
OS gate that is unknown leaves the recipe eligible but *provisional*; a library gate
needs positive evidence, since "maybe installed" cannot be built against.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from ktforge.detect.blis import AOCL_INT8_NEEDS
from ktforge.detect.report_types import BlisSection, GateStatus, MachineReport, RecommendedRecipe
from ktforge.resources import data_path, load_toml

LIBRARY_GATES = frozenset({"blis_addon"})
# Each failing gate's remedy is in the one remedy table (data/remedies.toml, ktforge.remedies).
# Gates on what the machine is: unseen, they leave the choice open instead of provisional.
FACT_GATES = frozenset({"arch", "vendor", "cpu_features"})


@dataclass(frozen=True)
class RecipeFacts:
    """What the gates read of a machine report (tests give them directly)."""

    system: str | None
    arch: str | None
    vendor: str | None
    features: frozenset[str] | None  # usable features; None: not seen
    os_state: Mapping[str, object]
    amx_permitted: bool | None
    amx_execution: str | None
    amx_explanation: str
    blis: BlisSection | None
    disabled: frozenset[str] = frozenset()  # KTFORGE_DISABLE_CPU_FEATURES: not in features, said so

    @staticmethod
    def of(report: MachineReport) -> RecipeFacts:
        cpu, amx_info = report["cpu"], report["amx"]
        usable = cpu["usable_features"]
        return RecipeFacts(
            system=report["os"]["system"],
            arch=cpu["arch"],
            vendor=cpu["vendor"],
            features=frozenset(usable) if usable is not None else None,
            os_state=cpu["os_state"],
            amx_permitted=amx_info["permitted"],
            amx_execution=amx_info["execution"],
            amx_explanation=amx_info["explanation"],
            blis=report["blis"],
            disabled=frozenset(cpu["disabled_features"]),
        )


class GateResult(TypedDict):
    gate: str
    status: GateStatus
    detail: str


class RecipeEvaluation(TypedDict):
    name: str
    priority: int
    summary: str
    compiler_must_accept: list[str]
    eligible: bool
    undetermined: bool
    provisional: bool
    why_not: list[str]
    failed_gates: list[GateResult]
    unverified: list[str]
    gates: list[GateResult]


class RecipeChoice(TypedDict):
    recommended: RecommendedRecipe
    provisional: bool
    unseen: list[str]
    recipes: list[RecipeEvaluation]
    not_seen_by_source: NotRequired[list[str]]


@dataclass(frozen=True)
class Recipe:
    name: str
    priority: int
    summary: str
    requires: dict[str, Any]
    backends: tuple[str, ...] = ()  # kernel backends compiled (KTFORGE_BACKENDS)
    extra_flags: tuple[str, ...] = ()  # beyond -march (native, or the target's)
    min_compiler: dict[str, str] | None = None  # family -> minimum version

    @property
    def compiler_must_accept(self) -> tuple[str, ...]:
        """The flags of a host build, which the compile probe must accept."""
        return ("-march=native", *self.extra_flags)


@functools.cache
def load_recipes() -> tuple[Recipe, ...]:
    recipes = []
    for path in sorted(data_path("recipes").glob("*.toml")):
        raw = load_toml(path)
        build = raw.get("build", {})
        recipes.append(
            Recipe(
                name=raw["name"],
                priority=int(raw["priority"]),
                summary=raw.get("summary", ""),
                requires=dict(raw.get("requires", {})),
                backends=tuple(build.get("backends", ())),
                extra_flags=tuple(build.get("extra_flags", ())),
                min_compiler=dict(build.get("min_compiler", {})),
            )
        )
    return tuple(sorted(recipes, key=lambda r: -r.priority))


def _gate(gate: str, status: GateStatus, detail: str) -> GateResult:
    return {"gate": gate, "status": status, "detail": detail}


def _status(value: object, passes: bool) -> GateStatus:
    return "unknown" if value is None else "pass" if passes else "fail"


def _blis_gate(blis: BlisSection | None) -> GateResult:
    if blis is None:
        return _gate("blis_addon", "unknown", "no evidence of a BLIS library (none was searched)")
    if blis["selected"]:
        return _gate("blis_addon", "pass", f"aocl_gemm works in {blis['selected']}")
    if wrong := [lib for lib in blis["libraries"] if lib["has_addon"]]:  # installed, but wrong on this CPU
        return _gate(
            "blis_addon",
            "fail",
            f"{wrong[0]['path']} has the aocl_gemm add-on, but its s8s8s32 GEMM gave "
            f"{wrong[0]['gemm_s8s8s32']} here: {AOCL_INT8_NEEDS}",
        )
    return _gate("blis_addon", "fail", "no BLIS library with a working aocl_gemm add-on")


def evaluate(recipe: Recipe, facts: RecipeFacts) -> RecipeEvaluation:
    """Gates of ``recipe`` against a machine's facts."""
    req = recipe.requires
    gates: list[GateResult] = []
    if "system" in req:
        system = facts.system
        status = _status(system, system == req["system"])
        gates.append(_gate("system", status, f"needs {req['system']}, machine runs {system or 'unknown'}"))
    if "arch" in req:
        arch = facts.arch
        status = _status(arch, arch == req["arch"])
        gates.append(_gate("arch", status, f"needs {req['arch']}, machine is {arch or 'unknown'}"))
    if "vendor" in req:
        vendor = facts.vendor
        status = _status(vendor, vendor in req["vendor"])
        gates.append(_gate("vendor", status, f"needs {' or '.join(req['vendor'])}, CPU is {vendor or 'unknown'}"))
    if "cpu_features" in req:
        have = facts.features
        if have is None:
            gates.append(_gate("cpu_features", "unknown", "CPU features unknown"))
        else:
            missing = [f for f in req["cpu_features"] if f not in have]
            hidden = " (disabled by KTFORGE_DISABLE_CPU_FEATURES)" if set(missing) & facts.disabled else ""
            detail = f"missing {', '.join(missing)}{hidden}" if missing else "all present"
            gates.append(_gate("cpu_features", "fail" if missing else "pass", detail))
    for state in req.get("os_state", []):
        value = facts.os_state.get(state)
        status = _status(value, bool(value))
        detail = {
            "pass": f"XCR0 enables {state} state",
            "fail": f"XCR0 does not enable {state} state",
            "unknown": f"{state} OS state not read (implied by the kernel's flags)",
        }[status]
        gates.append(_gate(f"os_state.{state}", status, detail))
    if req.get("amx_permission"):
        permitted = facts.amx_permitted
        gates.append(_gate("amx_permission", _status(permitted, bool(permitted)), facts.amx_explanation))
    if req.get("amx_execution"):
        execution = facts.amx_execution
        status = "pass" if execution == "ok" else "unknown" if execution in (None, "not-attempted") else "fail"
        gates.append(_gate("amx_execution", status, f"tile execution proof: {execution or 'not run'}"))
    if req.get("blis_addon"):
        gates.append(_blis_gate(facts.blis))

    failed = [g for g in gates if g["status"] == "fail" or (g["status"] == "unknown" and g["gate"] in LIBRARY_GATES)]
    unknown = [g for g in gates if g["status"] == "unknown" and g["gate"] not in LIBRARY_GATES]
    # What the CPU is (its features, vendor, architecture, OS) must be seen to choose a recipe;
    # OS state and permissions that a dump cannot show only make the choice provisional.
    unseen = [g for g in unknown if g["gate"] in FACT_GATES]
    return {
        "name": recipe.name,
        "priority": recipe.priority,
        "summary": recipe.summary,
        "compiler_must_accept": list(recipe.compiler_must_accept),
        "eligible": not failed and not unseen,
        "undetermined": not failed and bool(unseen),
        "provisional": not failed and not unseen and bool(unknown),
        "why_not": [f"{g['gate']}: {g['detail']}" for g in failed],
        "failed_gates": failed,
        "unverified": [f"{g['gate']}: {g['detail']}" for g in unknown],
        "gates": gates,
    }


def choose(facts: RecipeFacts) -> RecipeChoice:
    """The recommended recipe: the highest-priority eligible recipe; ``unknown`` when a better
    recipe's gates need a fact that was not seen (a dump without flags, say); ``none`` when
    every recipe fails. ``unseen`` names the facts that were missing."""
    evaluated = [evaluate(r, facts) for r in load_recipes()]
    chosen = next((e for e in evaluated if e["eligible"] or e["undetermined"]), None)
    unseen = sorted(
        {
            g["detail"]
            for e in evaluated
            if e["undetermined"]
            for g in e["gates"]
            if g["status"] == "unknown" and g["gate"] in FACT_GATES
        }
    )
    return {
        "recommended": "unknown" if chosen and chosen["undetermined"] else chosen["name"] if chosen else "none",
        "provisional": bool(chosen and chosen["provisional"]),
        "unseen": unseen,
        "recipes": evaluated,
    }
