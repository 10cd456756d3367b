"""Carrying out a Plan (ktforge.builder.planner): build, verify, install.

Build: scikit-build-core (CMake + Ninja) into a wheel, in a build directory per plan hash
(rebuilds take seconds), under a lock, with the full log kept. Verify: the wheel is unpacked
aside and ``python -m ktforge.builder.verify`` checks every compiled kernel that runs here against the
reference on random data before anything is installed, so a failed build or verification
leaves the previous install as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

from ktforge import process
from ktforge.builder.planner import Plan, PlanError
from ktforge.builder.verify import Verified

# Every command has a time limit (a hung compiler or index is stopped, with its process group):
# generous for compiling, which takes minutes on 2 cores.
BUILD_TIMEOUT_S = 3 * 3600.0
VERIFY_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 600.0

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


def _run_python_module(module: str, args: list[str], log: Path, cwd: Path, timeout: float) -> bool:
    """``python -m module args`` (isolated: see ktforge.process), its output appended to ``log``."""
    command = process.python_command(module, args)
    with log.open("a") as out:
        out.write(f"\n$ {sys.executable} -I -m {module} {' '.join(args)}\n")
        try:
            done = process.run(command, cwd=cwd, log=out, timeout=timeout)
        except subprocess.TimeoutExpired:
            out.write(f"\n(no result within {timeout:.0f} s: stopped)\n")
            return False
    return done.returncode == 0


def build_wheel(plan: Plan, source: Path, step: Callable[[str], None]) -> tuple[Path, Path]:
    """Builds the plan's wheel; returns (wheel, log). Raises PlanError naming the log on failure."""
    work = source / "build" / f"kt-{plan.recipe}-{plan.key()}"
    dist = work / "dist"
    log = work / "build.log"
    work.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    shutil.rmtree(dist, ignore_errors=True)
    import importlib.util

    # reuse this environment's build tools when it has them (fast, offline); else pip isolates
    local_tools = all(importlib.util.find_spec(m) for m in ("scikit_build_core", "pybind11"))
    # --config-settings, not -C: the pip of Debian 12's venvs (23.0) lacks the short form
    pip_args = ["wheel", "--no-deps", "-w", str(dist), f"--config-settings=build-dir={work / 'cmake'}"]
    if local_tools:
        pip_args.insert(2, "--no-build-isolation")
    for key, value in plan.cmake_defines.items():
        pip_args.append(f"--config-settings=cmake.define.{key}={value}")
    pip_args.append(str(source))
    step(f"compiling {plan.recipe} ({' '.join(plan.flags)})")
    if not _run_python_module("pip", pip_args, log, source, BUILD_TIMEOUT_S):
        raise PlanError(f"the build failed; the full log is {log}")
    wheels = sorted(dist.glob("ktforge-*.whl"))
    if not wheels:
        raise PlanError(f"the build produced no wheel; see {log}")
    return wheels[-1], log


class BuildResult(TypedDict):
    wheel: str
    log: str
    installed: bool
    verified: NotRequired[list[Verified]]  # host builds only


def verify_wheel(wheel: Path, log: Path) -> list[Verified]:
    """Every compiled kernel that runs here against the reference, from the unpacked wheel."""
    with tempfile.TemporaryDirectory(prefix="kt-verify-") as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
        site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
        # site=False: the unpacked wheel, not an installed (or editable) ktforge, is what gets imported
        command = process.python_command("ktforge.builder.verify", paths=[tmp, *site], site=False)
        try:
            done = process.run(command, timeout=VERIFY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PlanError(
                f"verification did not finish within {VERIFY_TIMEOUT_S:.0f} s; nothing was installed"
            ) from None
    with log.open("a") as out:
        out.write("\n$ verify\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PlanError(f"verification crashed ({tail[0]}); the full log is {log}")
    results: list[Verified] = json.loads(done.stdout.strip().splitlines()[-1])
    bad = [r for r in results if not r["ok"]]
    if bad:
        raise PlanError(
            "verification failed: "
            + "; ".join(f"{r['backend']} {r['method']} differs from the reference by {r['rel_err']:.2e}" for r in bad)
            + f"; nothing was installed; the full log is {log}"
        )
    return results


def install_wheel(wheel: Path, log: Path) -> None:
    args = ["install", "--no-deps", "--force-reinstall", str(wheel)]
    if not _run_python_module("pip", args, log, wheel.parent, INSTALL_TIMEOUT_S):
        raise PlanError(f"installing {wheel.name} failed; the full log is {log}")


def repair_wheel(wheel: Path, dist: Path, log: Path) -> Path:
    """auditwheel: the manylinux tag of the oldest glibc the wheel runs on (and any library it
    links beside it); the repaired wheel goes to ``dist``."""
    out = Path(tempfile.mkdtemp(prefix="kt-repair-"))
    try:
        args = ["repair", "--wheel-dir", str(out), str(wheel)]
        if not _run_python_module("auditwheel", args, log, wheel.parent, INSTALL_TIMEOUT_S):
            raise PlanError(f"auditwheel could not tag {wheel.name}; the full log is {log}")
        [repaired] = out.glob("*.whl")
        dist.mkdir(parents=True, exist_ok=True)
        target = dist / repaired.name
        shutil.move(str(repaired), target)
        return target
    finally:
        shutil.rmtree(out, ignore_errors=True)


def keep_installed(wheel: Path, build: Path) -> Path:
    """A copy of the wheel just installed, in ``build/installed/`` (the only one there): the same
    build for another environment of this machine (vLLM's, say), which a later build of the same
    plan cannot replace before it is installed itself."""
    kept = build / "installed"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    return Path(shutil.copy2(wheel, kept / wheel.name))


def carry_out(plan: Plan, source: Path, step: Callable[[str], None]) -> BuildResult:
    """Build the plan's wheel under the lock; a host build is verified, installed and kept
    (``keep_installed``), a target build is copied to ``dist/``, a portable build is verified
    (the levels this CPU runs) and tagged by auditwheel into ``dist/``."""
    verified: list[Verified] | None = None
    with build_lock(source / "build"):
        wheel, log = build_wheel(plan, source, step)
        if plan.portable:
            step("verifying the levels this CPU runs against the reference")
            verified = verify_wheel(wheel, log)
            step("tagging the wheel (auditwheel)")
            wheel = repair_wheel(wheel, source / "dist", log)
        elif plan.target is None:
            step("verifying every compiled kernel against the reference")
            verified = verify_wheel(wheel, log)
            step("installing")
            install_wheel(wheel, log)
            wheel = keep_installed(wheel, source / "build")
        else:
            dist = source / "dist"
            dist.mkdir(exist_ok=True)
            shutil.copy2(wheel, dist / wheel.name)
            wheel = dist / wheel.name
    where: BuildResult = {"wheel": str(wheel), "log": str(log), "installed": plan.target is None and not plan.portable}
    return where if verified is None else {"verified": verified, **where}
