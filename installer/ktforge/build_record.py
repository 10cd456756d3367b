"""The build record: what the installed extension was built with and what it needs.

Written at configure time by CMake (``python -m ktforge.build_record ...``) into
``build_record.json`` beside the extension, so it can be read without importing the
extension. The CPU features each backend needs come from the compiler's predefined macros
for that backend's exact flags, not from the build host.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from ktforge.features import COMPILER_MACROS

RECORD_NAME = "build_record.json"
RECORD_VERSION = 1


def compiled_features(compiler: str, flags: list[str]) -> list[str]:
    done = subprocess.run(
        [compiler, *flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True, check=True
    )
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    return [name for macro, name in COMPILER_MACROS.items() if macro in defined]


def _git_revision(source_dir: str) -> str:
    try:
        done = subprocess.run(["git", "-C", source_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    if done.returncode != 0:
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", source_dir, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return done.stdout.strip() + ("+dirty" if dirty else "")


def make_record(args: argparse.Namespace) -> dict[str, Any]:
    backends = []
    for spec in args.backend:
        name, _, flags = spec.partition("=")
        flag_list = flags.split()
        backends.append(
            {"name": name, "flags": flag_list, "required_cpu_features": compiled_features(args.compiler, flag_list)}
        )
    backends.append({"name": "reference", "flags": [], "required_cpu_features": []})
    return {
        "record_version": RECORD_VERSION,
        "ktforge_version": args.version,
        "recipe": args.recipe or "default",
        "primary_backend": args.primary or None,
        "target": args.target or None,
        "arch_flags": args.arch_flags,
        "compiler": {"path": args.compiler, "id": args.compiler_id, "version": args.compiler_version},
        "backends": backends,
        "host_fingerprint": args.host_fingerprint or None,
        "blis": {"library": args.blis_library} if args.blis_library else None,
        "source_revision": _git_revision(args.source_dir),
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "built_on": platform.node(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="write ktforge's build record (run by CMake)")
    for option in ("--compiler", "--compiler-id", "--compiler-version", "--version", "--source-dir", "--output"):
        parser.add_argument(option, required=True)
    for option in ("--recipe", "--target", "--arch-flags", "--host-fingerprint", "--blis-library", "--primary"):
        parser.add_argument(option, default="")
    parser.add_argument("--backend", action="append", default=[], help="name=flags")
    args = parser.parse_args(argv)
    Path(args.output).write_text(json.dumps(make_record(args), indent=1) + "\n")


def installed_record() -> dict[str, Any] | None:
    """The record beside the installed extension (None when there is none)."""
    import ktforge

    spec = ktforge.__spec__
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location, RECORD_NAME)
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                return None
            return data if isinstance(data, dict) else None
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
