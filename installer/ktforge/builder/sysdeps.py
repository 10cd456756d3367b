"""System packages for building ktforge: the per-distribution table and the commands.

Run by ``./install.sh deps`` before ktforge itself is installed, so it needs only the
standard library; the distribution is read with the ``distro`` package when it is
importable and from /etc/os-release otherwise (what ``distro`` reads on Linux too).

    python -m ktforge.builder.sysdeps cxx cmake ...   prints one shell command per line (or exit 3:
                                              unknown distribution, with the list on stderr)
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent.parent / "data" / "system_packages.json"


def distribution_ids() -> list[str]:
    """The distribution's id followed by the ids it is like (lowercase)."""
    try:
        import distro

        return [distro.id(), *distro.like().split()]
    except ImportError:
        fields: dict[str, str] = {}
        try:
            for line in Path("/etc/os-release").read_text().splitlines():
                key, _, value = line.partition("=")
                fields[key] = value.strip().strip('"')
        except OSError:
            return []
        return [fields.get("ID", ""), *fields.get("ID_LIKE", "").split()]


def family(ids: list[str], table: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]] | None:
    table = table or json.loads(TABLE.read_text())
    for name, entry in table.items():
        if name.startswith("_"):
            continue
        if any(i in entry["ids"] for i in ids if i):
            return name, entry
    return None


def commands(missing: list[str], ids: list[str]) -> list[list[str]]:
    found = family(ids)
    if found is None:
        raise LookupError(f"unknown distribution {' '.join(ids) or '(no /etc/os-release)'}")
    name, entry = found
    unknown = [m for m in missing if m not in entry["packages"]]
    if unknown:
        raise LookupError(f"no {name} package is known for {', '.join(unknown)}")
    packages = list(dict.fromkeys(entry["packages"][m] for m in missing))
    env = [f"{k}={v}" for k, v in entry.get("env", {}).items()]
    prefix = ["env", *env] if env else []
    out = []
    if "refresh" in entry:
        out.append([*prefix, *entry["refresh"]])
    out.append([*prefix, *entry["install"], *packages])
    return out


def main(argv: list[str]) -> int:
    try:
        for command in commands(argv, distribution_ids()):
            print(shlex.join(command))
    except LookupError as exc:
        print(f"{exc}: install {', '.join(argv)} yourself", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
