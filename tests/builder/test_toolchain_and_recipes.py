"""Compile probes of the toolchain, and the recipe gates' logic."""

from __future__ import annotations

import json
import shutil
from typing import Any

from ktforge.builder import recipes
from ktforge.builder.assessment import assess
from ktforge.detect import toolchain
from ktforge.detect.evidence import Evidence
from ktforge.doctor import run_checks

from ..conftest import HOST_FIXTURES


def test_compile_probe_tells_accepted_from_rejected_flags() -> None:
    gxx = shutil.which("g++")
    assert gxx, "g++ is required to build ktforge"
    assert toolchain.accepts(gxx, ["-mavx512f"]) is True
    assert toolchain.accepts(gxx, ["-mno-such-isa-flag"]) is False
    info = toolchain.describe_compiler(gxx, cache := {})
    assert info["family"] == "gcc" and info["version"][0].isdigit()
    assert set(info["accepts"]) == set(toolchain.PROBED_FLAGS)
    assert cache  # remembered by binary identity
    assert toolchain.describe_compiler(gxx, cache) == info


def test_collect_reports_python_headers_and_build_tools() -> None:
    found = toolchain.collect()
    assert found["python_headers"]["present"] is True
    assert any(c["language"] == "c++" for c in found["compilers"])


def _facts(**overrides: Any) -> recipes.RecipeFacts:
    facts: dict[str, Any] = {
        "system": "Linux",
        "arch": "x86_64",
        "vendor": "AuthenticAMD",
        "features": frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}),
        "os_state": {"avx": True, "avx512": True, "amx": False},
        "amx_permitted": False,
        "amx_execution": "not-attempted",
        "amx_explanation": "no AMX",
        "blis": {"selected": "/opt/libblis-mt.so", "libraries": [], "searched": [], "selected_library_dir": "/opt"},
    }
    facts.update(overrides)
    return recipes.RecipeFacts(**facts)


def test_amd_with_working_blis_gets_amd_blis() -> None:
    assert recipes.choose(_facts())["recommended"] == "amd-blis"


def test_library_gate_needs_positive_evidence() -> None:
    chosen = recipes.choose(_facts(blis=None))
    assert chosen["recommended"] == "avx512"
    amd = next(r for r in chosen["recipes"] if r["name"] == "amd-blis")
    assert amd["why_not"] == ["blis_addon: no evidence of a BLIS library (none was searched)"]


def test_cpu_gate_unknown_is_provisional_not_rejected() -> None:
    chosen = recipes.choose(_facts(os_state={"avx": None, "avx512": None, "amx": None}, blis=None))
    assert chosen["recommended"] == "avx512" and chosen["provisional"] is True


def test_os_state_off_rejects_avx512() -> None:
    chosen = recipes.choose(_facts(os_state={"avx": True, "avx512": False, "amx": False}, blis=None))
    assert chosen["recommended"] == "avx2"


def test_recipes_are_ordered_by_priority() -> None:
    assert [r.name for r in recipes.load_recipes()] == ["amx", "amd-blis", "avx512", "avx2"]


def test_extension_built_for_a_richer_cpu_is_an_error() -> None:
    document = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    document["evidence"]["extension"]["build_info"]["required_cpu_features"].append("amx_fp16")
    report = assess(Evidence.from_snapshot(document))
    [finding] = run_checks(report, ["extension.installed"])
    assert finding.status == "error" and "amx_fp16" in finding.finding


def test_extension_with_a_backend_for_a_richer_cpu_is_a_warning() -> None:
    document = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    document["evidence"]["extension"]["build_info"]["backends"] = [
        {"name": "avx512", "required_cpu_features": ["avx512f", "amx_fp16"]},
        {"name": "reference", "required_cpu_features": []},
    ]
    report = assess(Evidence.from_snapshot(document))
    [finding] = run_checks(report, ["extension.installed"])
    assert finding.status == "warn"
    assert "avx512 needs amx_fp16" in finding.finding and "reference run here" in finding.finding


def test_extension_without_the_machine_s_best_backend_is_a_warning_naming_the_build() -> None:
    # the bootstrap install (`pip install .`: reference kernels only) on a machine avx512 suits
    document = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    document["evidence"]["extension"]["build_info"]["backends"] = [{"name": "reference", "required_cpu_features": []}]
    report = assess(Evidence.from_snapshot(document))
    best = report["recipe"]["recommended"]
    assert best in ("avx512", "amx")
    [finding] = run_checks(report, ["extension.installed"])
    assert finding.status == "warn"
    assert f"built without {best}" in finding.finding and "./install.sh build" in finding.commands
    document["evidence"]["extension"]["build_info"]["backends"].append({"name": best, "required_cpu_features": []})
    [finding] = run_checks(assess(Evidence.from_snapshot(document)), ["extension.installed"])
    assert finding.status == "ok"
