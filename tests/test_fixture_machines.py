"""Every recorded machine replayed through `kt doctor --from`, with the backend it should get.

Expectations follow from the recipes: AMX needs AMX+AVX-512 (Sapphire Rapids), avx512
needs F/BW/VL/DQ, avx2 needs AVX2+FMA+F16C, everything needs Linux on x86-64; text
dumps carry no BLIS evidence, so amd-blis is never recommended from one.
"""

from __future__ import annotations

import re

import pytest

from ktforge import evidence
from ktforge.doctor import exit_code, run_checks
from ktforge.report import build_report

from .conftest import CPUINFO_FIXTURES, HOST_FIXTURES

NON_X86 = [
    "bgq-rhel6-power7",
    "darwin-bigsur-m1",
    "darwin-monterey-m1",
    "darwin-monterey-m2",
    "darwin-sequoia-m3",
    "darwin-sequoia-m4",
    "linux-amazon-cortex_a72",
    "linux-amazon-neoverse_n1",
    "linux-amazon-neoverse_v1",
    "linux-asahi-m1",
    "linux-asahi-m2",
    "linux-centos7-power8le",
    "linux-centos7-thunderx2",
    "linux-debian13-x60",
    "linux-rhel8-neoverse_v1",
    "linux-rhel8-power9",
    "linux-rhel9-neoverse_n2",
    "linux-rhel9-neoverse_v2",
    "linux-rocky8-a64fx",
    "linux-sifive-u74mc",
    "linux-spacemit-x60",
    "linux-ubuntu22.04-ampere1",
    "linux-ubuntu22.04-ampere1a",
    "linux-ubuntu22.04-neoverse_n2",
    "linux-ubuntu22.04-neoverse_v2",
    "linux-ubuntu24.04-neoverse_v3ae",
    "linux-unknown-neoverse_v2",
    "linux-unknown-power10",
]
EXPECTED: dict[str, str] = dict.fromkeys(NON_X86, "none")
EXPECTED.update(
    {
        # x86 without AVX2 (Sandy/Ivy Bridge, K10, Bulldozer family): nothing to run
        "linux-rhel7-ivybridge": "none",
        "linux-rhel6-piledriver": "none",
        "linux-scientific7-k10": "none",
        "linux-scientific7-piledriver": "none",
        "linux-scientificfermi6-bulldozer": "none",
        "linux-scientificfermi6-piledriver": "none",
        # macOS: the CPU could, the OS cannot
        "darwin-mojave-haswell": "none",
        "darwin-mojave-ivybridge": "none",
        "darwin-mojave-skylake": "none",
        # AVX2 machines
        "linux-rhel7-broadwell": "avx2",
        "linux-rhel7-haswell": "avx2",
        "linux-rhel7-x86_64_v3": "avx2",
        "linux-rhel7-zen": "avx2",
        "linux-ubuntu18.04-broadwell": "avx2",
        "linux-ubuntu20.04-zen3": "avx2",
        "linux-ubuntu24.04-alderlake": "avx2",
        "linux-ubuntu26.04-arrowlake_s": "avx2",
        "windows-cpuid-broadwell": "avx2",
        # AVX-512 machines (no AMX; AMD ones lack BLIS evidence in a dump)
        "linux-centos7-cascadelake": "avx512",
        "linux-rhel7-skylake_avx512": "avx512",
        "linux-rocky8.5-zen4": "avx512",
        "linux-rocky9-zen5": "avx512",
        "windows-cpuid-icelake": "avx512",
        # AMX
        "linux-unknown-sapphirerapids": "amx",
    }
)


def test_every_fixture_has_an_expectation() -> None:
    on_disk = {p.name for p in CPUINFO_FIXTURES.iterdir() if not p.name.startswith("LICENSE")}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_backend(name: str) -> None:
    report = build_report(evidence.from_file(CPUINFO_FIXTURES / name))
    backend = report["backend"]
    assert backend["recommended"] == EXPECTED[name]
    # A dump cannot prove OS state or AMX permission: any choice made from one is provisional.
    assert backend["provisional"] is (EXPECTED[name] != "none")
    findings = run_checks(report)
    by_id = {f.id: f for f in findings}
    assert by_id["blis.found"].status == "unknown"  # no BLIS evidence in a text dump
    assert by_id["extension.installed"].status == "unknown"
    assert (exit_code(findings) == 1) is (EXPECTED[name] == "none")
    if EXPECTED[name] == "none":
        assert by_id["backend.recommended"].status == "error"


def test_zen4_dump_names_zen4_and_rejects_amd_blis_for_lack_of_evidence() -> None:
    report = build_report(evidence.from_file(CPUINFO_FIXTURES / "linux-rocky8.5-zen4"))
    assert report["cpu"]["microarchitecture"]["name"] == "zen4"
    amd_blis = next(r for r in report["backend"]["recipes"] if r["name"] == "amd-blis")
    assert not amd_blis["eligible"]
    assert any("no evidence of a BLIS library" in reason for reason in amd_blis["why_not"])


def test_sapphire_rapids_dump_amx_gates_are_unverified_not_failed() -> None:
    report = build_report(evidence.from_file(CPUINFO_FIXTURES / "linux-unknown-sapphirerapids"))
    amx_recipe = next(r for r in report["backend"]["recipes"] if r["name"] == "amx")
    assert amx_recipe["eligible"] and amx_recipe["provisional"]
    assert {u.split(":")[0] for u in amx_recipe["unverified"]} == {
        "os_state.avx512",
        "os_state.amx",
        "amx_permission",
        "amx_execution",
    }
    assert report["amx"]["verdict"] == "unknown"


def test_tiger_lake_cpuid_dump_named_from_model_table() -> None:
    report = build_report(evidence.from_file(CPUINFO_FIXTURES / "windows-cpuid-icelake"))
    uarch = report["cpu"]["microarchitecture"]
    # i7-1185G7 is family 6 model 140: Tiger Lake, which archspec files under icelake's features
    assert (uarch["name"], uarch["source"]) == ("tigerlake", "model-table")


def test_darwin_haswell_is_rejected_for_the_os_not_the_cpu() -> None:
    report = build_report(evidence.from_file(CPUINFO_FIXTURES / "darwin-mojave-haswell"))
    avx2 = next(r for r in report["backend"]["recipes"] if r["name"] == "avx2")
    assert avx2["why_not"] == ["system: needs Linux, machine runs Darwin"]


def test_a_hypervisor_hiding_a_flag_does_not_demote_the_name() -> None:
    # The EPYC 9654 dump as a KVM guest whose CPU model drops pku (what KVM's named AMD models
    # do): archspec alone calls that "zen2; zen3 but for pku". The model number says Genoa.
    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    guest = re.sub(r"\b(pku|ospke)\b ?", "", text).replace("flags\t\t:", "flags\t\t: hypervisor", 1)
    report = build_report(evidence.from_text(guest))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["by_features"] == "zen2" and uarch["source"] == "model-table"
    assert (uarch["name"], uarch["products"]) == ("zen4", "EPYC 9004 (Genoa)")
    assert uarch["hidden"] == ["pku"] and uarch["hidden_used_by_kernels"] == []
    assert report["backend"]["recommended"] == "avx512"
    finding = {f.id: f for f in run_checks(report)}["system.hypervisor"]
    assert finding.status == "ok" and "hides pku (not used by the kernels)" in finding.finding


def test_a_hidden_flag_the_kernels_use_is_a_warning() -> None:
    # the same guest without AVX-512 (some clouds hide it): still a zen4, and the doctor says
    # which of the hidden flags the kernels would have used
    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    guest = re.sub(r"\bavx512\w*\b ?", "", text).replace("flags\t\t:", "flags\t\t: hypervisor", 1)
    report = build_report(evidence.from_text(guest))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["name"] == "zen4" and "avx512f" in uarch["hidden_used_by_kernels"]
    assert report["backend"]["recommended"] == "avx2"  # the kernels can only use what is visible
    finding = {f.id: f for f in run_checks(report)}["system.hypervisor"]
    assert finding.status == "warn" and "avx512f" in finding.finding


def test_a_masked_model_number_falls_back_to_the_features() -> None:
    # a Sapphire Rapids whose hypervisor reports model 167 (Rocket Lake, which has no AMX)
    report = build_report(evidence.from_file(HOST_FIXTURES / "kvm-sapphirerapids-masked.lscpu"))
    uarch = report["cpu"]["microarchitecture"]
    assert uarch["source"] == "archspec" and uarch["model_table"]["unexpected"]
    assert any(d["topic"] == "cpu.model" for d in report["disagreements"])
