"""Planning `kt build`: the machine report and the recipes in, a Plan out; nothing is built.

The plan names the recipe (auto: the report's recommendation), its flags, the reasons, and for
every rejected recipe why not. A forced recipe whose gates fail is refused before compiling,
each gate with its remedy (data/remedies.toml, ktforge.remedies). Host builds use -march=native plus the
recipe's flags; target builds use the target's own -march from archspec, checked by the
compile probe: never a silent fallback. ktforge.builder.executor carries a plan out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from ktforge.builder import backends as backends_table
from ktforge.builder import recipes
from ktforge.builder.assessment import Assessment
from ktforge.detect import toolchain
from ktforge.detect.report_types import Compiler, MachineReport
from ktforge.process import which
from ktforge.remedies import remedy

PLAN_SCHEMA_VERSION = 2  # 2: "backend" became "recipe"
RECIPE_CHOICES = ("auto", *(r.name for r in recipes.load_recipes()))  # the recipes, best first


class Rejected(TypedDict):
    name: str
    why_not: list[str]


class MissingGate(TypedDict):
    """A gate the plan cannot pass, with its remedy (data/remedies.toml, ktforge.remedies)."""

    gate: str
    detail: str
    remedy: str


class PlanError(Exception):
    """The plan cannot be built; the message lists every reason."""


@dataclass
class Plan:
    recipe: str
    ok: bool
    target: str | None
    flags: list[str]
    kernel_backends: list[str]
    reasons: list[str]
    rejected: list[Rejected]
    missing: list[MissingGate]
    compiler: Compiler | None
    blis_library: str | None
    cmake_defines: dict[str, str] = field(default_factory=dict)
    schema_version: int = PLAN_SCHEMA_VERSION
    portable: bool = False  # one wheel for every x86-64 (kt build --portable): dist/, not installed

    def key(self) -> str:
        stuff = json.dumps(
            [
                self.recipe,
                self.portable,
                self.target,
                self.flags,
                self.kernel_backends,
                self.blis_library,
                self.compiler["path"] if self.compiler else None,
                self.compiler["version"] if self.compiler else None,
                sorted(self.cmake_defines.items()),  # another configuration: another CMake cache
            ]
        )
        return hashlib.sha256(stuff.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


# gcc's -march spellings of archspec's names
TARGET_ALIASES = {
    "znver3": "zen3",
    "znver4": "zen4",
    "znver5": "zen5",
    "skylake-avx512": "skylake_avx512",
    "icelake-server": "icelake",
    "cascadelake-server": "cascadelake",
}


def target_features(target: str) -> set[str]:
    import archspec.cpu

    features = set(archspec.cpu.TARGETS[TARGET_ALIASES.get(target, target)].features)
    if "sse3" in features:
        features.add("pni")
    return features


def _target_flags(target: str, compiler: Compiler) -> list[str]:
    """-march/-mtune for a named microarchitecture, from archspec's compiler tables."""
    import archspec.cpu

    target = TARGET_ALIASES.get(target, target)
    if target not in archspec.cpu.TARGETS:
        known = ", ".join(sorted(n for n, t in archspec.cpu.TARGETS.items() if t.family.name == "x86_64"))
        raise PlanError(f"unknown target '{target}' (known x86-64 targets: {known})")
    uarch = archspec.cpu.TARGETS[target]
    version = compiler["version"]
    errors = []
    # archspec's ranges are written as major.minor; try the full version, then major.minor
    for candidate in (version, ".".join(version.split(".")[:2])):
        try:
            return str(uarch.optimization_flags(compiler["family"], candidate)).split()
        except Exception as exc:  # archspec raises its own UnsupportedMicroarchitecture
            errors.append(str(exc))
    raise PlanError(f"{compiler['name']} {version} cannot target {target}: {errors[-1]}")


def _missing(gate: str, detail: str) -> MissingGate:
    """A failed gate, with its remedy from the one table (data/remedies.toml, ktforge.remedies)."""
    return {"gate": gate, "detail": detail, "remedy": remedy(gate).text}


def make_plan(report: Assessment, recipe: str = "auto", target: str | None = None) -> Plan:
    """The build of ``recipe`` ('auto': the recommended one) for this machine, or ``target``."""
    recipe_name = recipe
    if recipe_name not in RECIPE_CHOICES:
        raise PlanError(f"--recipe must be one of {', '.join(RECIPE_CHOICES)}")
    evaluated = {r["name"]: r for r in report["recipe"]["recipes"]}
    name = report["recipe"]["recommended"] if recipe_name == "auto" else recipe_name
    rejected: list[Rejected] = [
        {"name": n, "why_not": r["why_not"]} for n, r in evaluated.items() if n != name and not r["eligible"]
    ]
    toolchain_found = report["toolchain"]
    compilers = [c for c in (toolchain_found["compilers"] if toolchain_found else []) if c["language"] == "c++"]
    compiler = compilers[0] if compilers else None
    missing: list[MissingGate] = []

    def nothing(reason: str, missing: list[MissingGate]) -> Plan:
        return Plan(
            recipe="none",
            ok=False,
            target=target,
            flags=[],
            kernel_backends=[],
            reasons=[reason],
            rejected=rejected,
            missing=missing,
            compiler=compiler,
            blis_library=None,
        )

    if name == "unknown":
        unseen = report["recipe"]["unseen"]
        return nothing(
            f"cannot choose a recipe: the machine report does not show {'; '.join(unseen)}",
            [_missing("facts", d) for d in unseen],
        )
    if name == "none":
        lowest = min(evaluated.values(), key=lambda r: r["priority"])
        return nothing(
            "no recipe can be built for this machine",
            [_missing(g["gate"], f"{g['gate']}: {g['detail']}") for g in lowest["failed_gates"]],
        )
    chosen = next(r for r in recipes.load_recipes() if r.name == name)
    reasons, missing = _gates(chosen, evaluated[name], recipe_name, target)
    flags, flag_problems = _compiler_flags(chosen, compiler, target)
    missing += flag_problems
    blis_library = None
    if chosen.requires.get("blis_addon") and compiler is not None:
        blis = report["blis"]
        blis_library = blis["selected"] if blis else None
    defines = (
        {}
        if compiler is None
        else {
            "KTFORGE_ARCH_FLAGS": " ".join(flags),
            "KTFORGE_BACKENDS": ";".join(chosen.backends),
            "KTFORGE_RECIPE": name,
            "KTFORGE_TARGET": target or "",
            "KTFORGE_HOST_FINGERPRINT": host_fingerprint(report) if target is None else "",
            "KTFORGE_BLIS_LIBRARY": blis_library or "",
        }
    )
    return Plan(
        recipe=name,
        ok=not missing,
        target=target,
        flags=flags,
        kernel_backends=list(chosen.backends),
        reasons=reasons,
        rejected=rejected,
        missing=missing,
        compiler=compiler,
        blis_library=blis_library,
        cmake_defines=defines,
    )


def _gates(
    recipe: recipes.Recipe, chosen: recipes.RecipeEvaluation, recipe_name: str, target: str | None
) -> tuple[list[str], list[MissingGate]]:
    """Why the recipe fits, and what is missing: a host build needs every gate to hold here
    (unknown library evidence counts as failed); a target build needs the target's features
    (archspec), not this host's."""
    name = recipe.name
    if target is None:
        reasons = [f"{g['gate']}: {g['detail']}" for g in chosen["gates"] if g["status"] == "pass"]
        if recipe_name == "auto":
            reasons.insert(0, f"{name} is the highest-priority recipe whose gates pass on this machine")
        return reasons, [_missing(g["gate"], f"{g['gate']}: {g['detail']}") for g in chosen["failed_gates"]]
    reasons = [f"--target {target}: built for that machine; this machine's execution gates are not required"]
    missing: list[MissingGate] = []
    try:
        have = target_features(target)
    except KeyError:
        return reasons, missing  # an unknown target is reported with the flags, with the known ones
    lacking = [f for f in recipe.requires.get("cpu_features", []) if f not in have]
    if lacking:
        missing.append(_missing("target_features", f"{target} lacks {', '.join(lacking)}"))
    else:
        reasons.append(f"{target} has {', '.join(recipe.requires.get('cpu_features', []))}")
    return reasons, missing


def _compiler_flags(
    recipe: recipes.Recipe, compiler: Compiler | None, target: str | None
) -> tuple[list[str], list[MissingGate]]:
    """The recipe's flags for this compiler (``-march=native`` on the host, the target's
    ``-march`` otherwise), compile-probed, and what stands in the way."""
    if compiler is None:
        return [], [_missing("compiler", "no C++ compiler found")]
    missing: list[MissingGate] = []
    floor = (recipe.min_compiler or {}).get(compiler["family"])
    if floor and _version_tuple(compiler["version"]) < _version_tuple(floor):
        old = f"{compiler['name']} {compiler['version']} is older than {floor}, the oldest that builds {recipe.name}"
        missing.append(_missing("compiler_version", old))
    try:
        base = ["-march=native"] if target is None else _target_flags(target, compiler)
    except PlanError as exc:
        missing.append(_missing("target", str(exc)))
        base = []
    flags = [*base, *recipe.extra_flags]
    if base and not toolchain.accepts(compiler["path"], flags):
        missing.append(
            _missing("compiler_flags", f"{compiler['name']} {compiler['version']} rejects {' '.join(flags)}")
        )
    return flags, missing


PORTABLE = "portable"


def portable_backends() -> list[str]:
    """Every level a portable wheel holds: the backend table's rows for all builds and for
    portable ones, best first (not the test tools)."""
    return [b.name for b in backends_table.table() if b.builds in ("all", "portable")]


def make_portable_plan(report: Assessment) -> Plan:
    """One wheel for every x86-64: each backend at exactly its level's flags, the core at the
    baseline, no library linked (AOCL is found at run time). Nothing of this machine goes in."""
    toolchain_found = report["toolchain"]
    compilers = [c for c in (toolchain_found["compilers"] if toolchain_found else []) if c["language"] == "c++"]
    compiler = compilers[0] if compilers else None
    levels = portable_backends()
    missing: list[MissingGate] = []
    if compiler is None:
        missing.append(_missing("compiler", "no C++ compiler found"))
    else:
        for name in levels:
            flags = list(backends_table.by_name(name).flags)
            if not toolchain.accepts(compiler["path"], flags):
                missing.append(
                    _missing(
                        "compiler_flags",
                        f"{compiler['name']} {compiler['version']} rejects the {name} level's {' '.join(flags)} "
                        "(a portable wheel holds every level)",
                    )
                )
    import importlib.util

    if importlib.util.find_spec("auditwheel") is None or which("patchelf") is None:
        missing.append(_missing("auditwheel", "auditwheel and patchelf tag the wheel for the oldest glibc it runs on"))
    defines = {
        "KTFORGE_PORTABLE": "ON",
        "KTFORGE_ARCH_FLAGS": "",
        "KTFORGE_BACKENDS": ";".join(levels),
        "KTFORGE_RECIPE": PORTABLE,
        "KTFORGE_TARGET": "",
        "KTFORGE_HOST_FINGERPRINT": "",
        "KTFORGE_BLIS_LIBRARY": "",
    }
    return Plan(
        recipe=PORTABLE,
        ok=not missing,
        target=None,
        flags=[],
        kernel_backends=levels,
        reasons=[
            "portable: every x86-64 level in one wheel, each compiled with exactly its flags; the best this "
            "CPU, its OS state and its AMX permission allow is chosen at run time"
        ],
        rejected=[],
        missing=missing,
        compiler=compiler,
        blis_library=None,
        cmake_defines=defines if compiler is not None else {},
        portable=True,
    )


def host_fingerprint(report: MachineReport) -> str:
    cpu = report["cpu"]
    text = json.dumps([cpu["vendor"], cpu["family"], cpu["model"], cpu["stepping"], cpu["usable_features"]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def format_plan(plan: Plan) -> str:
    where = " (every x86-64)" if plan.portable else f" (target {plan.target})" if plan.target else " (this machine)"
    lines = [f"recipe: {plan.recipe}{where}"]
    if plan.flags:
        lines.append(f"flags: {' '.join(plan.flags)}")
    if plan.kernel_backends:
        lines.append(f"kernels: {', '.join(plan.kernel_backends)}, reference")
    if plan.compiler:
        lines.append(f"compiler: {plan.compiler['name']} {plan.compiler['version']} ({plan.compiler['path']})")
    if plan.blis_library:
        lines.append(f"BLIS: {plan.blis_library}")
    lines += [f"  because {reason}" for reason in plan.reasons]
    for r in plan.rejected:
        lines.append(f"not {r['name']}: {'; '.join(r['why_not'])}")
    if plan.missing:
        lines.append("cannot build:")
        for m in plan.missing:
            lines.append(f"  ✗ {m['detail']}" + (f"\n      fix: {m['remedy']}" if m["remedy"] else ""))
    return "\n".join(lines)
