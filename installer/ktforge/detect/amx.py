"""Interpreting the AMX permission probe: what the kernel answered, in plain words."""

from __future__ import annotations

import errno
from typing import Any

from ktforge.detect.features import XFEATURE_XTILEDATA
from ktforge.detect.report_types import AmxSection, AmxVerdict, ProbeOutcomeJson

TILEDATA = 1 << XFEATURE_XTILEDATA


# Linux aliases ENOTSUP to EOPNOTSUPP; the kernel's AMX code (and its docs) say EOPNOTSUPP.
_PREFERRED_NAMES = {errno.EOPNOTSUPP: "EOPNOTSUPP"}


def _errno_name(number: int) -> str:
    if not number:
        return ""
    return _PREFERRED_NAMES.get(number) or errno.errorcode.get(number, f"errno {number}")


def interpret(probe: ProbeOutcomeJson | None, cpu_has_amx: bool | None, os_amx: bool | None) -> AmxSection:
    """Verdict on AMX from the probe (a ProbeOutcome JSON) and the CPUID/XCR0 facts.

    verdict: available, no-amx-cpu, os-disabled, kernel-unsupported, permission-denied,
    execution-failed, probe-failed or unknown (no probe data, e.g. a text dump).
    """
    result: AmxSection = {
        "verdict": "unknown",
        "explanation": "",
        "probe_status": None,
        "supported_mask": None,
        "permitted_before": None,
        "request_errno": None,
        "request_errno_name": None,
        "permitted_after": None,
        "permitted": None,
        "execution": None,
    }
    result["verdict"], result["explanation"] = _verdict(result, probe, cpu_has_amx, os_amx)
    return result


def _verdict(
    result: AmxSection, probe: ProbeOutcomeJson | None, cpu_has_amx: bool | None, os_amx: bool | None
) -> tuple[AmxVerdict, str]:
    """Fill ``result``'s facts from ``probe``; return the verdict and its explanation."""
    if probe is None:
        if cpu_has_amx is False:
            return "no-amx-cpu", "this CPU has no AMX"
        return "unknown", "no permission probe was run (text dump): AMX permission is unknown"
    status = probe.get("status")
    data: dict[str, Any] = probe.get("data") or {}
    result["probe_status"] = status
    if status != "ok" or "request" not in data:
        return "probe-failed", f"the AMX permission probe did not run: {status}: {probe.get('detail', '')}"
    supp = data.get("supported") or {}
    before = data.get("permitted_before") or {}
    after = data.get("permitted_after") or {}
    request = data["request"]
    result["supported_mask"] = supp.get("bits") if supp.get("rc") == 0 else None
    result["permitted_before"] = before.get("bits") if before.get("rc") == 0 else None
    result["request_errno"] = request.get("errno", 0)
    result["request_errno_name"] = _errno_name(int(request.get("errno", 0)))
    result["permitted_after"] = after.get("bits") if after.get("rc") == 0 else None
    result["execution"] = data.get("execution")
    granted = request.get("rc") == 0 and bool((result["permitted_after"] or 0) & TILEDATA)
    result["permitted"] = granted
    err = result["request_errno_name"]

    if supp.get("rc") != 0:
        return "kernel-unsupported", (
            f"the kernel does not know ARCH_GET_XCOMP_SUPP ({_errno_name(int(supp.get('errno', 0)))}): "
            "AMX needs Linux 5.16 or newer"
        )
    if cpu_has_amx is False:
        return "no-amx-cpu", "this CPU has no AMX" + (
            f" (the kernel answers the permission request with {err}, as expected)" if err else ""
        )
    if os_amx is False:
        return "os-disabled", "the CPU has AMX but XCR0 bits 17-18 (tile state) are off: the kernel did not enable it"
    if not (result["supported_mask"] or 0) & TILEDATA:
        return "kernel-unsupported", "the kernel does not offer tile data state (ARCH_GET_XCOMP_SUPP lacks bit 18)"
    if not granted:
        return "permission-denied", (
            f"the kernel refused ARCH_REQ_XCOMP_PERM(XTILEDATA): {err or 'no reason given'}"
            + (" (the sigaltstack is too small for tile state)" if err == "ENOSPC" else "")
        )
    if result["execution"] == "ok":
        return "available", "permission granted and tile instructions executed"
    if result["execution"] == "not-attempted":
        return "unknown", "permission granted; execution was not tried"
    return "execution-failed", f"permission granted but tile instructions failed: {result['execution']}"
