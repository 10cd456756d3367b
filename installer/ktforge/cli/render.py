"""Text rendering of doctor findings: one line per check, remedies for anything not ok.

Colour only on a terminal and never when NO_COLOR is set; ASCII marks when the
output encoding cannot show the Unicode ones.
"""

from __future__ import annotations

import os
from typing import TextIO

from ktforge.builder.assessment import Assessment
from ktforge.detect.report_types import MachineReport
from ktforge.doctor import Finding, summarize

_MARKS = {"ok": ("✓", "ok"), "info": ("•", "--"), "warn": ("!", "!!"), "error": ("✗", "XX"), "unknown": ("?", "??")}
_COLORS = {"ok": "32", "info": "36", "warn": "33", "error": "31", "unknown": "35"}


def use_color(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") is not None:
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def _unicode_ok(stream: TextIO) -> bool:
    encoding = (getattr(stream, "encoding", None) or "").lower()
    return encoding.replace("-", "") in ("utf8", "utf16", "utf32")


def headline(report: MachineReport) -> str:
    cpu = report["cpu"]
    uarch = cpu["microarchitecture"]
    closest = uarch.get("closest_newer")
    label = uarch["name"] + (f": {uarch['products']}" if uarch.get("products") else "")
    if closest:
        label += f"; {closest['name']} but for {', '.join(closest['missing'])}"
    if uarch.get("hidden"):
        label += f"; not visible here: {', '.join(uarch['hidden'])}"
    parts = [cpu["brand"] or cpu["vendor"] or "unknown CPU", f"[{label}]"]
    if cpu["hypervisor"]:
        parts.append(f"under {cpu['hypervisor']}")
    source = report["source"]
    where = "this machine" if source["kind"] == "live" else f"{source['kind']} {source['origin'] or ''}".strip()
    return f"ktforge doctor: {where}: {' '.join(parts)}"


def render(report: Assessment, findings: list[Finding], stream: TextIO, color: bool) -> None:
    unicode_ok = _unicode_ok(stream)
    width = max((len(f.id) for f in findings), default=10)

    def paint(status: str, text: str) -> str:
        return f"\x1b[{_COLORS[status]}m{text}\x1b[0m" if color else text

    print(headline(report), file=stream)
    category = None
    for finding in findings:
        if finding.category != category:
            category = finding.category
            print(f"\n{category}", file=stream)
        mark = _MARKS[finding.status][0 if unicode_ok else 1]
        print(f"  {paint(finding.status, mark)} {finding.id.ljust(width)}  {finding.finding}", file=stream)
        if finding.status != "ok" and (finding.remedy or finding.commands):
            if finding.remedy:
                print(f"      fix: {finding.remedy}", file=stream)
            for command in finding.commands:
                print(f"        $ {command}", file=stream)
    counts = summarize(findings)
    choice = report["recipe"]
    provisional = " (provisional)" if choice["provisional"] else ""
    summary = (
        f"{counts['ok']} ok, {counts['info']} info, {counts['warn']} warnings, "
        f"{counts['error']} errors, {counts['unknown']} unknown; "
        f"recommended recipe: {choice['recommended']}{provisional}"
    )
    worst = "error" if counts["error"] else "warn" if counts["warn"] else "ok"
    print(f"\n{paint(worst, 'Summary:')} {summary}", file=stream)
