"""The machine report with the build stage's verdict on it: which recipe, and why not the others.

Detecting (``ktforge.detect.report``) states facts; choosing a recipe is the build stage's.
This is the document ``kt doctor`` prints and ``kt build`` plans from.
"""

from __future__ import annotations

from ktforge.builder.recipes import RecipeChoice, RecipeFacts, choose
from ktforge.detect.evidence import Evidence
from ktforge.detect.report import build_report
from ktforge.detect.report_types import MachineReport


class Assessment(MachineReport):
    recipe: RecipeChoice


def recommend(report: MachineReport, evidence: Evidence | None = None) -> RecipeChoice:
    """The recipe choice for ``report``; with the evidence, a provisional or open choice also
    names what its source could not show."""
    choice = choose(RecipeFacts.of(report))
    if evidence is not None and (choice["provisional"] or choice["recommended"] == "unknown"):
        choice["not_seen_by_source"] = evidence.not_seen_by_source()
    return choice


def assess(evidence: Evidence) -> Assessment:
    report = build_report(evidence)
    return Assessment(**report, recipe=recommend(report, evidence))
