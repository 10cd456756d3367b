"""CPUID through py-cpuinfo: the one source that needs no C compiler.

On a fresh server ``kt doctor`` runs before ``./install.sh deps`` has installed gcc, so the
probes (compiled on the spot) cannot run. py-cpuinfo executes CPUID from Python; its
decoding covers leaves 1, 7.0 and 0x80000001 (not leaf 7.1, XCR0 or the AMX permission,
which need the probes). With the probes present it is one more witness in ``sources.agree``.
"""

from __future__ import annotations

from typing import Any

from ktforge.features import PYCPUINFO_NAMES


def collect() -> dict[str, Any]:
    """``{"status": "ok", "vendor", "brand", "family", "model", "stepping", "flags"}`` with linux
    flag names, or ``{"status": "unavailable"|"failed", "detail"}``."""
    try:
        from cpuinfo import cpuinfo
    except ImportError as exc:
        return {"status": "unavailable", "detail": f"py-cpuinfo is not installed ({exc})"}
    try:
        # Its CPUID path alone: get_cpu_info() prefers /proc/cpuinfo on Linux, a source the
        # report already has. Runs CPUID in a child process, so a fault cannot take us down.
        raw = cpuinfo._get_cpu_info_from_cpuid()
    except Exception as exc:  # a third-party internal: any failure is a status, not a crash
        return {"status": "failed", "detail": f"{type(exc).__name__}: {exc}"}
    if not raw or not raw.get("flags"):
        return {"status": "failed", "detail": "py-cpuinfo read no CPUID flags (not x86, or CPUID unavailable)"}
    return {
        "status": "ok",
        "vendor": raw.get("vendor_id_raw"),
        "brand": raw.get("brand_raw"),
        "family": raw.get("family"),
        "model": raw.get("model"),
        "stepping": raw.get("stepping"),
        "flags": sorted({PYCPUINFO_NAMES.get(f, f) for f in raw["flags"]}),
    }
