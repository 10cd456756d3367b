"""Findings: what a check reports (id, category, status, title, what was found, remedy and
commands), the registry of checks, and the summary and exit code of a run.

A check is registered once with its id, category and title; it gets a ``say`` bound to that
id, so each finding names its check in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, TypedDict, get_args

from ktforge.builder.assessment import Assessment
from ktforge.detect.report_types import Schema

FindingStatus = Literal["ok", "info", "warn", "error", "unknown"]
STATUSES: tuple[FindingStatus, ...] = get_args(FindingStatus)
# a check id: category.name
FindingId = Annotated[str, Schema(keywords={"pattern": r"^[a-z0-9_]+\.[a-z0-9_]+$"})]


class FindingJson(TypedDict):
    id: FindingId
    category: str
    status: FindingStatus
    title: str
    finding: str
    remedy: str
    commands: list[str]


class Summary(TypedDict):
    ok: int
    info: int
    warn: int
    error: int
    unknown: int


@dataclass(frozen=True)
class Finding:
    id: str
    category: str
    status: FindingStatus
    title: str
    finding: str
    remedy: str = ""
    commands: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> FindingJson:
        return {
            "id": self.id,
            "category": self.category,
            "status": self.status,
            "title": self.title,
            "finding": self.finding,
            "remedy": self.remedy,
            "commands": list(self.commands),
        }


class Say(Protocol):
    """A finding of the check it was made for."""

    def __call__(self, status: FindingStatus, finding: str, remedy: str = "", *commands: str) -> Finding: ...


@dataclass(frozen=True)
class _Bound:
    id: str
    category: str
    title: str

    def __call__(self, status: FindingStatus, finding: str, remedy: str = "", *commands: str) -> Finding:
        return Finding(self.id, self.category, status, self.title, finding, remedy, tuple(commands))


Check = Callable[[Assessment, Say], Finding]
_REGISTRY: list[tuple[_Bound, Check]] = []
# The report's order: by category, then as each category's module registers its checks.
CATEGORIES = ("platform", "cpu", "amx", "blis", "toolchain", "extension", "system", "recipe")


def check(check_id: str, category: str, title: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        _REGISTRY.append((_Bound(check_id, category, title), fn))
        _REGISTRY.sort(key=lambda entry: CATEGORIES.index(entry[0].category))  # stable: keeps module order
        return fn

    return register


def list_checks() -> list[tuple[str, str, str]]:
    return [(bound.id, bound.category, bound.title) for bound, _ in _REGISTRY]


def run_checks(report: Assessment, only: list[str] | None = None) -> list[Finding]:
    known = {bound.id for bound, _ in _REGISTRY}
    unknown = [c for c in (only or []) if c not in known]
    if unknown:
        raise KeyError(f"unknown check id(s): {', '.join(unknown)} (see kt doctor --list-checks)")
    return [fn(report, bound) for bound, fn in _REGISTRY if not only or bound.id in only]


def summarize(findings: list[Finding]) -> Summary:
    def count(status: FindingStatus) -> int:
        return sum(1 for f in findings if f.status == status)

    return {
        "ok": count("ok"),
        "info": count("info"),
        "warn": count("warn"),
        "error": count("error"),
        "unknown": count("unknown"),
    }


def exit_code(findings: list[Finding], strict: bool = False) -> int:
    counts = summarize(findings)
    if counts["error"] or (strict and counts["warn"]):
        return 1
    return 0
