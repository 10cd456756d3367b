"""``kt doctor``'s engine: every gate between this machine and fast, correct kernels.

Each check reads the assessment (never the machine) and returns a finding with a stable id, a
status (ok, info, warn, error, unknown), what was found and, for anything not ok, the remedy
and the exact commands. The checks live by category (cpu, blis, toolchain, system), in the
order ``kt doctor`` prints them; the CLI only parses options and prints.
"""

from __future__ import annotations

from ktforge.doctor import blis, cpu, numa, system, toolchain  # noqa: F401  (each registers its checks)
from ktforge.doctor.findings import (
    STATUSES,
    Finding,
    FindingJson,
    FindingStatus,
    Summary,
    exit_code,
    list_checks,
    run_checks,
    summarize,
)

__all__ = [
    "STATUSES",
    "Finding",
    "FindingJson",
    "FindingStatus",
    "Summary",
    "exit_code",
    "list_checks",
    "run_checks",
    "summarize",
]
