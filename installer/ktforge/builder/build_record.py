"""The build record: what the installed extension was built with and what it needs.

Written at configure time by CMake (``python -m ktforge.builder.build_record ...``) into
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

from ktforge import process
from ktforge.builder import backends as backends_table
from ktforge.detect.features import COMPILER_MACROS

RECORD_NAME = "build_record.json"
RECORD_VERSION = 1


def compiled_features(compiler: str, flags: list[str]) -> list[str]:
    done = process.run([compiler, *flags, "-dM", "-E", "-x", "c++", os.devnull], timeout=120)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    return [name for macro, name in COMPILER_MACROS.items() if macro in defined]


def _git_revision(source_dir: str) -> str:
    try:
        done = process.run(["git", "-C", source_dir, "rev-parse", "HEAD"], timeout=60)
        if done.returncode != 0:
            return "unknown"
        status = ["git", "-C", source_dir, "status", "--porcelain", "--untracked-files=no"]
        dirty = process.run(status, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() + ("+dirty" if dirty else "")


def make_record(args: argparse.Namespace) -> dict[str, Any]:
    backends = []
    for spec in args.backend:
        name, _, flags = spec.partition("=")
        backends_table.by_name(name)  # a backend of the table, spelled as the kernels report it
        flag_list = flags.split()
        backends.append(
            {"name": name, "flags": flag_list, "required_cpu_features": compiled_features(args.compiler, flag_list)}
        )
    backends.append({"name": "reference", "flags": [], "required_cpu_features": []})
    return {
        "record_version": RECORD_VERSION,
        "ktforge_version": args.version,
        "recipe": args.recipe or "default",
        "primary_backend": backends_table.by_name(args.primary).name if args.primary else None,
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


class RecordError(RuntimeError):
    """The build record is missing, unreadable or disagrees with the extension beside it."""


REBUILD = "rebuild: `kt build` (or `./install.sh build`)"


def _record_path() -> Path | None:
    import ktforge

    spec = ktforge.__spec__
    for location in list(spec.submodule_search_locations or []) if spec else []:
        if Path(location, RECORD_NAME).is_file():
            return Path(location, RECORD_NAME)
    return None


def installed_record() -> dict[str, Any] | None:
    """The record beside the installed extension, None when there is none or it is unusable
    (for reports; the import guard uses :func:`checked_record`, which says why)."""
    try:
        return checked_record()
    except RecordError:
        return None


def checked_record(build_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The installed build record, checked: present, JSON, this format, every field the guard
    reads well-formed, and (given the extension's ``build_info()``) naming the same version
    and backends as the extension. Raises RecordError naming the problem and the fix."""
    path = _record_path()
    if path is None:
        raise RecordError(f"the build record ({RECORD_NAME}) is missing beside the extension; {REBUILD}")
    try:
        text = path.read_text(encoding="utf-8")
        record = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = "empty" if not path.stat().st_size else f"unreadable ({exc})"
        raise RecordError(f"the build record {path} is {why}; {REBUILD}") from exc
    if not isinstance(record, dict):
        raise RecordError(f"the build record {path} is not a JSON object; {REBUILD}")
    if record.get("record_version") != RECORD_VERSION:
        raise RecordError(
            f"the build record {path} has format {record.get('record_version')!r}, this ktforge reads "
            f"{RECORD_VERSION}; {REBUILD}"
        )
    backends = record.get("backends")
    if not isinstance(backends, list) or not all(
        isinstance(b, dict)
        and isinstance(b.get("name"), str)
        and isinstance(b.get("required_cpu_features"), list)
        and all(isinstance(f, str) for f in b["required_cpu_features"])
        for b in backends
    ):
        raise RecordError(f"the build record {path} has no well-formed backend list; {REBUILD}")
    names = [b["name"] for b in backends]
    primary = record.get("primary_backend")
    if primary is not None and primary not in names:
        raise RecordError(
            f"the build record {path} names backend {primary!r}, which it does not list ({', '.join(names)}); {REBUILD}"
        )
    if build_info is not None:
        compiled = [b["name"] for b in build_info.get("backends", [])]
        if sorted(compiled) != sorted(names):
            raise RecordError(
                f"the build record {path} lists backends {', '.join(names)} but the extension has "
                f"{', '.join(compiled)}: they come from different builds; {REBUILD}"
            )
        if record.get("ktforge_version") != build_info.get("version"):
            raise RecordError(
                f"the build record {path} is for ktforge {record.get('ktforge_version')}, the extension is "
                f"{build_info.get('version')}; {REBUILD}"
            )
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
