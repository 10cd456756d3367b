"""Two builds of ktforge timed against each other in one run: `kt bench` on each, alternating,
so that the machine's drift (bandwidth swings 2x within an hour on shared hosts) falls on both.

Each build is a folder a wheel was installed into (`pip install --no-deps --target DIR WHEEL`).
Prints, per method and token count, the second build's time over the first's: the median of the
rounds' ratios and their range (each round's time is `kt bench`'s median of its repeats).

    git worktree add /tmp/before main && (cd /tmp/before && kt build --source .)
    pip install --no-deps --target /tmp/ab/before /tmp/before/build/installed/*.whl
    kt build && pip install --no-deps --target /tmp/ab/after build/installed/*.whl
    python scripts/compare_builds.py /tmp/ab/before /tmp/ab/after --rounds 3 \\
        --bench "--method int4,int8g --group-size 128" --bench "--method q4_k,q8_0 --group-size 32"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections import defaultdict


def bench(build: str, args: str, tokens: str, repeats: int) -> dict[tuple[str, int, int], float]:
    """(method, group size, tokens) -> ms of one `kt bench` run of the build in folder ``build``."""
    command = [sys.executable, "-m", "ktforge", "bench", "--json", "--no-peer", "--routing", "uniform"]
    command += ["--tokens", tokens, "--repeats", str(repeats), *shlex.split(args)]
    env = {**os.environ, "PYTHONPATH": build}
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    return {(r["method"], report["group_size"], r["tokens"]): r["ms"] for r in report["results"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", help="folder the first (baseline) build is installed in")
    parser.add_argument("second", help="folder the second build is installed in")
    parser.add_argument("--bench", action="append", required=True, help="kt bench options of one run (repeatable)")
    parser.add_argument("--tokens", default="1,512")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    ratios: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for round_ in range(options.rounds):
        for args in options.bench:
            # alternate which build goes first, so neither always runs on a warmer machine
            order = (options.first, options.second) if round_ % 2 == 0 else (options.second, options.first)
            times = {build: bench(build, args, options.tokens, options.repeats) for build in order}
            for case, ms in times[options.second].items():
                ratios[case].append(ms / times[options.first][case])
        print(f"round {round_ + 1} of {options.rounds} done", file=sys.stderr)
    print(f"{'method':<8} {'group':>5} {'tokens':>6}  second/first time: median [min, max] of {options.rounds} rounds")
    for (method, group, tokens), values in sorted(ratios.items()):
        spread = f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
        print(f"{method:<8} {group:>5} {tokens:>6}  {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
