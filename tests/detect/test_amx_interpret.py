"""The AMX permission probe's answers, read into verdicts (recorded kernel answers)."""

from __future__ import annotations

import errno
from typing import Any

from ktforge.builder.assessment import assess
from ktforge.detect.amx import interpret
from ktforge.detect.evidence import Evidence

from ..conftest import HOST_FIXTURES

XCR0_AVX512 = 0x2E7  # x87|SSE|AVX|opmask|ZMM: what a Zen 4 kernel reports
XCR0_AMX = 0x600E7


def _probe(
    supp: int,
    before: int,
    req_rc: int,
    req_errno: int,
    after: int,
    execution: str = "not-attempted",
    supp_rc: int = 0,
    supp_errno: int = 0,
) -> dict[str, Any]:
    return {
        "status": "ok",
        "detail": "",
        "data": {
            "supported": {"rc": supp_rc, "errno": supp_errno, "bits": supp},
            "permitted_before": {"rc": 0, "errno": 0, "bits": before},
            "request": {"rc": req_rc, "errno": req_errno},
            "permitted_after": {"rc": 0, "errno": 0, "bits": after},
            "execution": execution,
            "platform": "linux-x86_64",
        },
    }


def test_zen4_eopnotsupp_means_no_amx_cpu_not_a_failure() -> None:
    # What Linux answers on AMD Zen 4: SUPP lacks bit 18, REQ fails with EOPNOTSUPP.
    result = interpret(_probe(XCR0_AVX512, XCR0_AVX512, -1, errno.EOPNOTSUPP, XCR0_AVX512), False, False)
    assert result["verdict"] == "no-amx-cpu"
    assert result["request_errno_name"] == "EOPNOTSUPP"
    assert "this CPU has no AMX" in result["explanation"] and "EOPNOTSUPP" in result["explanation"]
    assert result["permitted"] is False


def test_granted_and_executed_is_available() -> None:
    result = interpret(_probe(XCR0_AMX, 0x200E7, 0, 0, XCR0_AMX, "ok"), True, True)
    assert result["verdict"] == "available" and result["permitted"] is True


def test_permission_denied_names_the_errno() -> None:
    result = interpret(_probe(XCR0_AMX, 0x200E7, -1, errno.EPERM, 0x200E7), True, True)
    assert result["verdict"] == "permission-denied"
    assert "EPERM" in result["explanation"]


def test_permission_granted_but_sigill_is_execution_failed() -> None:
    result = interpret(_probe(XCR0_AMX, 0x200E7, 0, 0, XCR0_AMX, "sigill"), True, True)
    assert result["verdict"] == "execution-failed" and "sigill" in result["explanation"]


def test_old_kernel_without_xcomp_supp() -> None:
    result = interpret(_probe(0, 0, -1, errno.EINVAL, 0, supp_rc=-1, supp_errno=errno.EINVAL), True, True)
    assert result["verdict"] == "kernel-unsupported" and "5.16" in result["explanation"]


def test_amx_cpu_with_tile_state_off() -> None:
    result = interpret(_probe(XCR0_AVX512, XCR0_AVX512, -1, errno.EOPNOTSUPP, XCR0_AVX512), True, False)
    assert result["verdict"] == "os-disabled"


def test_probe_that_crashed_is_reported_not_raised() -> None:
    result = interpret({"status": "crashed", "detail": "killed by SIGSEGV", "data": None}, True, True)
    assert result["verdict"] == "probe-failed" and "SIGSEGV" in result["explanation"]


def test_recorded_amx_machine_replays_to_amx_with_every_gate_proven() -> None:
    import json

    document = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    report = assess(Evidence.from_snapshot(document))
    assert report["amx"]["verdict"] == "available"
    assert report["recipe"]["recommended"] == "amx"
    assert report["recipe"]["provisional"] is False
    # the hypervisor reports model 167 (Rocket Lake, which has no AMX): flagged, not believed
    assert any(d["topic"] == "cpu.model" for d in report["disagreements"])


def _host_snapshot() -> dict[str, Any]:
    import json

    document: dict[str, Any] = json.loads((HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json").read_text())
    return document


def test_kernel_lists_amx_but_xcr0_tile_bits_off_is_reported_and_blocks_amx() -> None:
    from ktforge.doctor import run_checks

    document = _host_snapshot()
    document["evidence"]["cpu_probe"]["data"]["xcr0"] = 0xE7  # tile state off, AVX-512 on
    report = assess(Evidence.from_snapshot(document))
    assert any(d["topic"] == "os_state.amx" for d in report["disagreements"])
    assert report["recipe"]["recommended"] == "avx512"
    amx_recipe = next(r for r in report["recipe"]["recipes"] if r["name"] == "amx")
    assert "os_state.amx: XCR0 does not enable amx state" in amx_recipe["why_not"]
    findings = {f.id: f for f in run_checks(report)}
    assert findings["amx.xcr0"].status == "error"
    assert findings["sources.agree"].status == "warn"


def test_hypervisor_hiding_avx512_is_a_warning_with_the_fix() -> None:
    from ktforge.detect.evidence import from_text
    from ktforge.doctor import run_checks

    from ..conftest import CPUINFO_FIXTURES

    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    flags_line = next(line for line in text.splitlines() if line.startswith("flags"))
    hidden = " ".join(f for f in flags_line.split() if not f.startswith("avx512")) + " hypervisor"
    report = assess(from_text(text.replace(flags_line, hidden)))
    assert report["recipe"]["recommended"] == "avx2"
    finding = next(f for f in run_checks(report) if f.id == "system.hypervisor")
    assert finding.status == "warn" and "avx512f" in finding.finding
    assert any("-cpu host" in command for command in finding.commands)
