"""`kt build`: plan a recipe for this machine (or a named target), build it, verify it, install it.

Plan: the recipe (auto: the report's recommendation), its flags, the reasons, and for every
rejected recipe why not. A forced recipe whose gates fail is refused before compiling, each
gate with its remedy. Host builds use -march=native plus the recipe's flags; target builds
use the target's own -march from archspec, checked by the compile probe: never a silent
fallback. Build: scikit-build-core (CMake + Ninja) into a wheel, in a build directory per
plan hash (rebuilds take seconds), under a lock, with the full log kept. Verify: the wheel is
unpacked aside and every compiled kernel that runs here is checked against the reference on
random data before anything is installed, so a failed build or verification leaves the
previous install as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ktforge import recipes, toolchain

PLAN_SCHEMA_VERSION = 1
BACKEND_CHOICES = ("auto", *(r.name for r in recipes.load_recipes()))  # the recipes, best first


class PlanError(Exception):
    """The plan cannot be built; the message lists every reason."""


@dataclass
class Plan:
    backend: str
    ok: bool
    target: str | None
    flags: list[str]
    kernel_backends: list[str]
    reasons: list[str]
    rejected: list[dict[str, Any]]
    missing: list[dict[str, str]]
    compiler: dict[str, Any] | None
    blis_library: str | None
    cmake_defines: dict[str, str] = field(default_factory=dict)
    schema_version: int = PLAN_SCHEMA_VERSION

    def key(self) -> str:
        stuff = json.dumps(
            [
                self.backend,
                self.target,
                self.flags,
                self.kernel_backends,
                self.blis_library,
                (self.compiler or {}).get("path"),
                (self.compiler or {}).get("version"),
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


def _target_flags(target: str, compiler: dict[str, Any]) -> list[str]:
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


def _missing(gate: str, detail: str) -> dict[str, str]:
    """A failed gate, with its remedy from the one table (recipes.GATE_REMEDIES)."""
    return {"gate": gate, "detail": detail, "remedy": recipes.GATE_REMEDIES[gate]}


def make_plan(report: dict[str, Any], backend: str = "auto", target: str | None = None) -> Plan:
    if backend not in BACKEND_CHOICES:
        raise PlanError(f"--backend must be one of {', '.join(BACKEND_CHOICES)}")
    evaluated = {r["name"]: r for r in report["backend"]["recipes"]}
    name = report["backend"]["recommended"] if backend == "auto" else backend
    rejected = [{"name": n, "why_not": r["why_not"]} for n, r in evaluated.items() if n != name and not r["eligible"]]
    compilers = [c for c in (report.get("toolchain") or {}).get("compilers", []) if c.get("language") == "c++"]
    compiler = compilers[0] if compilers else None
    missing: list[dict[str, str]] = []

    def nothing(reason: str, missing: list[dict[str, str]]) -> Plan:
        return Plan(
            backend="none",
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
        unseen = report["backend"]["unseen"]
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
    recipe = next(r for r in recipes.load_recipes() if r.name == name)
    chosen = evaluated[name]
    reasons = [f"{g['gate']}: {g['detail']}" for g in chosen["gates"] if g["status"] == "pass"]
    if backend == "auto":
        reasons.insert(0, f"{name} is the highest-priority recipe whose gates pass on this machine")
    if target is None:
        # a host build: every gate must hold here (unknown library evidence counts as failed)
        missing += [_missing(g["gate"], f"{g['gate']}: {g['detail']}") for g in chosen["failed_gates"]]
    else:
        # a target build: the target's features (archspec) must meet the recipe, this host's need not
        reasons = [f"--target {target}: built for that machine; this machine's execution gates are not required"]
        try:
            have = target_features(target)
            lacking = [f for f in recipe.requires.get("cpu_features", []) if f not in have]
            if lacking:
                missing.append(_missing("target_features", f"{target} lacks {', '.join(lacking)}"))
            else:
                reasons.append(f"{target} has {', '.join(recipe.requires.get('cpu_features', []))}")
        except KeyError:
            pass  # an unknown target is reported below, with the list of known ones
    flags: list[str] = []
    if compiler is None:
        missing.append(_missing("compiler", "no C++ compiler found"))
    else:
        floor = (recipe.min_compiler or {}).get(compiler["family"])
        if floor and _version_tuple(compiler["version"]) < _version_tuple(floor):
            old = f"{compiler['name']} {compiler['version']} is older than {floor}, the oldest that builds {name}"
            missing.append(_missing("compiler_version", old))
        try:
            base = ["-march=native"] if target is None else _target_flags(target, compiler)
        except PlanError as exc:
            missing.append(_missing("target", str(exc)))
            base = []
        flags = [*base, *recipe.extra_flags]
        if base and not toolchain.accepts(compiler["path"], flags):
            rejects = f"{compiler['name']} {compiler['version']} rejects {' '.join(flags)}"
            missing.append(_missing("compiler_flags", rejects))
    blis_library = None
    if recipe.requires.get("blis_addon") and compiler is not None:
        blis = report.get("blis") or {}
        blis_library = blis.get("selected")
    defines = (
        {}
        if compiler is None
        else {
            "KTFORGE_ARCH_FLAGS": " ".join(flags),
            "KTFORGE_BACKENDS": ";".join(recipe.backends),
            "KTFORGE_RECIPE": name,
            "KTFORGE_TARGET": target or "",
            "KTFORGE_HOST_FINGERPRINT": host_fingerprint(report) if target is None else "",
            "KTFORGE_BLIS_LIBRARY": blis_library or "",
        }
    )
    return Plan(
        backend=name,
        ok=not missing,
        target=target,
        flags=flags,
        kernel_backends=list(recipe.backends),
        reasons=reasons,
        rejected=rejected,
        missing=missing,
        compiler=compiler,
        blis_library=blis_library,
        cmake_defines=defines,
    )


def host_fingerprint(report: dict[str, Any]) -> str:
    cpu = report["cpu"]
    text = json.dumps([cpu["vendor"], cpu["family"], cpu["model"], cpu["stepping"], cpu["usable_features"]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def format_plan(plan: Plan) -> str:
    lines = [f"recipe: {plan.backend}" + (f" (target {plan.target})" if plan.target else " (this machine)")]
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


# --- building ------------------------------------------------------------------------------


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Serialises concurrent builds of one checkout."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".kt-build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_logged(command: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None) -> bool:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return done.returncode == 0


def build_wheel(plan: Plan, source: Path, step: Callable[[str], None]) -> tuple[Path, Path]:
    """Builds the plan's wheel; returns (wheel, log). Raises PlanError naming the log on failure."""
    work = source / "build" / f"kt-{plan.backend}-{plan.key()}"
    dist = work / "dist"
    log = work / "build.log"
    work.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    shutil.rmtree(dist, ignore_errors=True)
    import importlib.util

    # reuse this environment's build tools when it has them (fast, offline); else pip isolates
    local_tools = all(importlib.util.find_spec(m) for m in ("scikit_build_core", "pybind11"))
    # --config-settings, not -C: the pip of Debian 12's venvs (23.0) lacks the short form
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-w",
        str(dist),
        f"--config-settings=build-dir={work / 'cmake'}",
    ]
    if local_tools:
        command.insert(5, "--no-build-isolation")
    for key, value in plan.cmake_defines.items():
        command.append(f"--config-settings=cmake.define.{key}={value}")
    command.append(str(source))
    step(f"compiling {plan.backend} ({' '.join(plan.flags)})")
    if not _run_logged(command, log, source):
        raise PlanError(f"the build failed; the full log is {log}")
    wheels = sorted(dist.glob("ktforge-*.whl"))
    if not wheels:
        raise PlanError(f"the build produced no wheel; see {log}")
    return wheels[-1], log


VERIFY_SCRIPT = r"""
import json, sys
import numpy as np
import ktforge, ktforge._native as native
results = []
rng = np.random.default_rng(0)
E, k, H, I, T = 4, 2, 72, 40, 9
gate = (rng.standard_normal((E, I, H)) / 8).astype(np.float32)
up = (rng.standard_normal((E, I, H)) / 8).astype(np.float32)
down = (rng.standard_normal((E, H, I)) / 6).astype(np.float32)
x = rng.standard_normal((T, H)).astype(np.float32)
ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int64)
w = rng.random((T, k)).astype(np.float32)
for method in ("bf16", "int8", "int4"):
    ref = ktforge.MoE(E, k, H, I, method=method, backend="reference", group_size=32)
    ref.load_weights(gate, up, down)
    expected = ref.forward(x, ids, w)
    for b in native.build_info()["backends"]:
        if b["name"] == "reference" or not b["runs_here"]:
            continue
        moe = ktforge.MoE(E, k, H, I, method=method, backend=b["name"], group_size=32)
        moe.load_weights(gate, up, down)
        err = float(np.abs(moe.forward(x, ids, w) - expected).max() / np.abs(expected).max())
        results.append({"backend": b["name"], "method": method, "kernel": moe.info["kernel"], "rel_err": err,
                        "ok": err < 1e-4})
info = native.build_info()
if info.get("blis"):
    results.append({"backend": "blis", "method": "int8", "kernel": info["blis"]["version"], "rel_err": 0.0,
                    "ok": bool(native.blis_gemm_selftest())})
print(json.dumps(results))
"""


def verify_wheel(wheel: Path, log: Path) -> list[dict[str, Any]]:
    """Every compiled kernel that runs here against the reference, from the unpacked wheel."""
    with tempfile.TemporaryDirectory(prefix="kt-verify-") as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
        site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, *site]))
        # -S: the unpacked wheel, not an installed (or editable) ktforge, is what gets imported
        done = subprocess.run(
            [sys.executable, "-S", "-c", VERIFY_SCRIPT], capture_output=True, text=True, env=env, timeout=600
        )
    with log.open("a") as out:
        out.write("\n$ verify\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PlanError(f"verification crashed ({tail[0]}); the full log is {log}")
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    bad = [r for r in results if not r["ok"]]
    if bad:
        raise PlanError(
            "verification failed: "
            + "; ".join(f"{r['backend']} {r['method']} differs from the reference by {r['rel_err']:.2e}" for r in bad)
            + f"; nothing was installed; the full log is {log}"
        )
    return results


def install_wheel(wheel: Path, log: Path) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)]
    if not _run_logged(command, log, wheel.parent):
        raise PlanError(f"installing {wheel.name} failed; the full log is {log}")
