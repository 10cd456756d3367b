"""The doctor's sentences name what concerns this machine, as people write it."""

from __future__ import annotations

import json
from typing import Any

from ktforge.builder.assessment import assess
from ktforge.detect.evidence import Evidence
from ktforge.detect.microarch import spelled
from ktforge.doctor import run_checks

from ..conftest import HOST_FIXTURES


def snapshot() -> dict[str, Any]:
    # an Intel guest (Sapphire Rapids, its model number masked by KVM) whose gcc cannot target znver4
    document: dict[str, Any] = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    return document


def finding(document: dict[str, Any], check: str) -> str:
    report = assess(Evidence.from_snapshot(document))
    return next(f.finding for f in run_checks(report) if f.id == check)


def test_names_with_their_articles() -> None:
    assert spelled("emeraldrapids", article=True) == "an Emerald Rapids"
    assert spelled("icelake", article=True) == "an Ice Lake"
    assert spelled("zen4", article=True) == "a Zen 4"
    assert spelled("skylake_avx512") == "Skylake-SP"
    assert spelled("x86_64_v3", article=True) == "an x86-64-v3"
    assert spelled("some_future_core") == "some_future_core"  # unknown: as given


def test_the_compiler_finding_names_only_the_hosts_vendors_target() -> None:
    document = snapshot()
    assert "znver4" not in finding(document, "toolchain.recipe_flags")  # an AMD target, on an Intel host
    for compiler in document["evidence"]["toolchain"]["compilers"]:
        compiler["accepts"]["-march=sapphirerapids"] = False
    assert "cannot target sapphirerapids by name" in finding(document, "toolchain.recipe_flags")
