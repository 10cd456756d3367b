"""What several checks read of the assessment."""

from __future__ import annotations

import shlex

from ktforge.builder.assessment import Assessment
from ktforge.detect.report_types import ProbeSummary

GIB = 1 << 30


def usable(r: Assessment) -> set[str] | None:
    usable = r["cpu"]["usable_features"]
    return set(usable) if usable is not None else None


def is_x86(r: Assessment) -> bool | None:
    arch = r["cpu"]["arch"]
    return None if arch is None else arch == "x86_64"


def has_amx_cpu(r: Assessment) -> bool | None:
    features = r["cpu"]["features"]
    return None if features is None else "amx_tile" in features


def probes_run(r: Assessment) -> dict[str, ProbeSummary]:
    """The probes that ran, by name."""
    found = {"cpu": r["probes"]["cpu"], "amx_permission": r["probes"]["amx_permission"]}
    return {name: summary for name, summary in found.items() if summary is not None}


def no_compiler(r: Assessment) -> bool:
    """The probes could not be compiled: no C compiler yet (a fresh server before deps)."""
    return any(p["status"] == "no-compiler" for p in probes_run(r).values())


def compiler_commands() -> tuple[str, ...]:
    """./install.sh deps, and the package manager's own command from the same table."""
    from ktforge.builder import sysdeps

    try:
        direct = [shlex.join(c) for c in sysdeps.commands(["cc", "cxx"], sysdeps.distribution_ids())]
    except LookupError:
        direct = []
    return ("./install.sh deps", *direct)


def amd(r: Assessment) -> bool:
    return bool(r["cpu"]["vendor"] == "AuthenticAMD")
