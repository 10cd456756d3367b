"""The kernel and format tests once per lower kind of host this machine can pass for.

    python3 scripts/masked_tests.py [--list] [--portable] [-- PYTEST ARGS]

Each kind (ktforge.builder.backends.host_kinds: AMX, AVX-512 with BF16, with VNNI, without VNNI,
AVX2, reference) is the level backend='auto' runs there; this machine passes for every kind below
its own by hiding the better levels' features with KTFORGE_DISABLE_CPU_FEATURES. Each run first
checks that 'auto' then runs that kind's level, so no run tests another level than it names.

The installed host build (-march=native) compiles the AVX-512 levels as one backend with every
feature of this CPU; a kind whose level it lacks runs against a portable build (every level at
exactly its flags), made once into build/masked-portable (or always, with --portable).
CI (.ci/run) runs this after the full suite. Exit status: pytest's worst, 1 if a kind's level is
not what 'auto' runs under its mask.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ktforge.builder import backends
from ktforge.builder.assessment import assess
from ktforge.detect import evidence, mask

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/kernels", "tests/checkpoints"]
PORTABLE = ROOT / "build" / "masked-portable"
AUTO = "import json, ktforge; print(json.dumps(ktforge.build_info()['selection']))"


def lower_kinds(usable: set[str]) -> list[tuple[str, list[str]]]:
    """(level, features to hide) of each kind below this machine's own, richest first."""
    kinds = [(name, hidden) for name, hidden in backends.host_kinds() if _level_runs(name, usable)]
    return [(name, sorted(hidden & usable)) for name, hidden in kinds[1:]]


def _level_runs(name: str, usable: set[str]) -> bool:
    return name == backends.ALWAYS or backends.by_name(name).features <= usable


def _selection(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", AUTO], env=env, capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        raise SystemExit(f"masked_tests: importing ktforge under the mask failed:\n{done.stderr[-2000:]}")
    selection: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return selection


def _portable_env(env: dict[str, str]) -> dict[str, str]:
    """env with a portable build first on the import path (built once)."""
    if not (PORTABLE / "ktforge").is_dir():
        subprocess.run([sys.executable, "-m", "ktforge", "build", "--portable", "--source", str(ROOT)], check=True)
        wheel = max((ROOT / "dist").glob("ktforge-*.whl"), key=os.path.getmtime)  # the one just made
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PORTABLE), str(wheel)],
            check=True,
        )
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PORTABLE), env.get("PYTHONPATH")]))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the kinds and their masks; run nothing")
    parser.add_argument("--portable", action="store_true", help="run every kind against a portable build")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if os.environ.get(mask.VARIABLE):
        parser.error(f"{mask.VARIABLE} is set: this script sets it per kind, from the whole machine")
    usable = set(assess(evidence.collect_live(with_blis=False))["cpu"]["usable_features"] or ())
    kinds = lower_kinds(usable)
    for name, hidden in kinds:
        print(f"masked_tests: as a {name} host: {mask.VARIABLE}={','.join(hidden)}")
    if not kinds:
        print("masked_tests: this machine is the lowest kind there is (the reference): nothing to mask")
    if args.list or not kinds:
        return 0
    worst = 0
    for name, hidden in kinds:
        env = {**os.environ, mask.VARIABLE: ",".join(hidden)}
        if args.portable:
            env = _portable_env(env)
        selection = _selection(env)
        if selection["auto"] != name and not args.portable:  # the host build lacks this level
            env = _portable_env(env)
            selection = _selection(env)
        if selection["auto"] != name:
            print(
                f"masked_tests: under {mask.VARIABLE}={env[mask.VARIABLE]} 'auto' runs {selection['auto']}, not {name}"
            )
            return 1
        build = "portable build" if str(PORTABLE) in env.get("PYTHONPATH", "") else "installed build"
        print(f"\n== as a {name} host ({build}): {mask.VARIABLE}={env[mask.VARIABLE]}", flush=True)
        start = time.monotonic()
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *TESTS, *args.pytest_args],
            env=env,
            cwd=ROOT,
        )
        print(f"== {name}: pytest exit {code} in {time.monotonic() - start:.0f} s", flush=True)
        worst = max(worst, 1 if code == 5 else code)  # "no tests ran" is a failure too
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
