"""CPUID through py-cpuinfo: the one source that needs no C compiler.

On a fresh server ``kt doctor`` runs before ``./install.sh deps`` has installed gcc, so the
probes (compiled on the spot) cannot run. py-cpuinfo executes CPUID from Python; its
decoding covers leaves 1, 7.0 and 0x80000001 (not leaf 7.1, XCR0 or the AMX permission,
which need the probes). With the probes present it is one more witness in ``sources.agree``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess

from ktforge import process
from ktforge.detect.features import PYCPUINFO_NAMES
from ktforge.detect.report_types import PycpuinfoResult


def collect(timeout_s: float = 20.0) -> PycpuinfoResult:
    """``{"status": "ok", "vendor", "brand", "family", "model", "stepping", "flags"}`` with linux
    flag names, or ``{"status": "unavailable"|"failed", "detail"}``."""
    if importlib.util.find_spec("cpuinfo") is None:
        return {"status": "unavailable", "detail": "py-cpuinfo is not installed (pip install py-cpuinfo)"}
    try:
        # in a child: py-cpuinfo executes machine code (see ktforge.detect.pycpuinfo_child)
        done = process.run(process.python_command("ktforge.detect.pycpuinfo_child"), timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"status": "failed", "detail": f"py-cpuinfo's CPUID child did not finish: {exc}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"status": "failed", "detail": f"py-cpuinfo's CPUID child failed: {why}"}
    try:
        raw: PycpuinfoResult = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        return {"status": "failed", "detail": f"py-cpuinfo's CPUID child printed no JSON: {exc}"}
    if raw.get("status") != "ok":
        return raw
    if not raw.get("flags"):
        return {"status": "failed", "detail": "py-cpuinfo read no CPUID flags"}
    raw["flags"] = sorted({PYCPUINFO_NAMES.get(f, f) for f in raw["flags"]})
    return raw
