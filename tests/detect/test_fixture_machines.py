"""Every recorded machine replayed through `kt doctor --from`, with the backend it should get.

Expectations follow from the recipes: AMX needs AMX+AVX-512 (Sapphire Rapids), avx512
needs F/BW/VL/DQ, avx2 needs AVX2+FMA+F16C, everything needs Linux on x86-64; text
dumps carry no BLIS evidence, so amd-blis is never recommended from one.
"""

from __future__ import annotations

import re

import pytest

from ktforge.builder.assessment import assess
from ktforge.detect import evidence
from ktforge.doctor import exit_code, run_checks

from ..conftest import CPUINFO_FIXTURES, HOST_FIXTURES
from ..fixture_expectations import EXPECTED


def test_every_fixture_has_an_expectation() -> None:
    on_disk = {p.name for p in CPUINFO_FIXTURES.iterdir() if not p.name.startswith("LICENSE")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_backend(name: str) -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / name))
    backend = report["recipe"]
    assert backend["recommended"] == EXPECTED[name]
    # A dump cannot prove OS state or AMX permission: any choice made from one is provisional.
    assert backend["provisional"] is (EXPECTED[name] != "none")
    findings = run_checks(report)
    by_id = {f.id: f for f in findings}
    assert by_id["blis.found"].status == "unknown"  # no BLIS evidence in a text dump
    assert by_id["extension.installed"].status == "unknown"
    assert (exit_code(findings) == 1) is (EXPECTED[name] == "none")
    if EXPECTED[name] == "none":
        assert by_id["recipe.recommended"].status == "error"


def test_zen4_dump_names_zen4_and_rejects_amd_blis_for_lack_of_evidence() -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / "linux-rocky8.5-zen4"))
    assert report["cpu"]["microarchitecture"]["name"] == "zen4"
    amd_blis = next(r for r in report["recipe"]["recipes"] if r["name"] == "amd-blis")
    assert not amd_blis["eligible"]
    assert any("no evidence of a BLIS library" in reason for reason in amd_blis["why_not"])


def test_sapphire_rapids_dump_amx_gates_are_unverified_not_failed() -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / "linux-unknown-sapphirerapids"))
    amx_recipe = next(r for r in report["recipe"]["recipes"] if r["name"] == "amx")
    assert amx_recipe["eligible"] and amx_recipe["provisional"]
    assert {u.split(":")[0] for u in amx_recipe["unverified"]} == {
        "os_state.avx512",
        "os_state.amx",
        "amx_permission",
        "amx_execution",
    }
    assert report["amx"]["verdict"] == "unknown"


def test_tiger_lake_cpuid_dump_named_from_model_table() -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / "windows-cpuid-icelake"))
    uarch = report["cpu"]["microarchitecture"]
    # i7-1185G7 is family 6 model 140: Tiger Lake, which archspec files under icelake's features
    assert (uarch["name"], uarch["source"]) == ("tigerlake", "model-table")


def test_darwin_haswell_is_rejected_for_the_os_not_the_cpu() -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / "darwin-mojave-haswell"))
    avx2 = next(r for r in report["recipe"]["recipes"] if r["name"] == "avx2")
    assert avx2["why_not"] == ["system: needs Linux, machine runs Darwin"]


def test_a_hypervisor_hiding_a_flag_does_not_demote_the_name() -> None:
    # The EPYC 9654 dump as a KVM guest whose CPU model drops pku (what KVM's named AMD models
    # do): archspec alone calls that "zen2; zen3 but for pku". The model number says Genoa.
    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    guest = re.sub(r"\b(pku|ospke)\b ?", "", text).replace("flags\t\t:", "flags\t\t: hypervisor", 1)
    report = assess(evidence.from_text(guest))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["by_features"] == "zen2" and uarch["source"] == "model-table"
    assert (uarch["name"], uarch["products"]) == ("zen4", "EPYC 9004 (Genoa)")
    assert uarch["hidden"] == ["pku"] and uarch["hidden_used_by_kernels"] == []
    assert report["recipe"]["recommended"] == "avx512"
    finding = {f.id: f for f in run_checks(report)}["system.hypervisor"]
    assert finding.status == "ok" and "hides pku (not used by the kernels)" in finding.finding


def test_a_hidden_flag_the_kernels_use_is_a_warning() -> None:
    # the same guest without AVX-512 (some clouds hide it): still a zen4, and the doctor says
    # which of the hidden flags the kernels would have used
    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    guest = re.sub(r"\bavx512\w*\b ?", "", text).replace("flags\t\t:", "flags\t\t: hypervisor", 1)
    report = assess(evidence.from_text(guest))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["name"] == "zen4" and "avx512f" in uarch["hidden_used_by_kernels"]
    assert report["recipe"]["recommended"] == "avx2"  # the kernels can only use what is visible
    finding = {f.id: f for f in run_checks(report)}["system.hypervisor"]
    assert finding.status == "warn" and "avx512f" in finding.finding


def test_a_masked_model_number_falls_back_to_the_features() -> None:
    # a Sapphire Rapids whose hypervisor reports model 167 (Rocket Lake, which has no AMX)
    report = assess(evidence.from_file(HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu"))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["source"] == "archspec" and uarch["model_table"]["unexpected"]
    assert any(d["topic"] == "cpu.model" for d in report["disagreements"])
