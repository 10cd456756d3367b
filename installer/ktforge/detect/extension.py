"""Inspect the installed native extension from a child process.

Importing a binary built for another CPU can kill the process with SIGILL, so the
doctor never imports it itself: a child does, and reports back (or dies, which is
reported too).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any, cast

from ktforge import process
from ktforge.detect.report_types import ExtensionStatus

MODULE = "ktforge._native"
CHILD = "ktforge.doctor.extension_child"  # what the child runs


def _status(child: dict[str, Any], **changes: str) -> ExtensionStatus:
    """The child's last line, with the doctor's verdict, as the report's type."""
    known = ExtensionStatus.__annotations__
    return cast(ExtensionStatus, {k: v for k, v in {**child, **changes}.items() if k in known})


def _json_object(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def inspect(module: str = MODULE, python: str = sys.executable, timeout_s: float = 30.0) -> ExtensionStatus:
    """Status of the extension: missing, broken, stale or ok, with what was learnt."""
    try:
        # The child imports the way this process does (same interpreter, import path and site
        # setting), isolated: nothing from the working directory.
        command = process.python_command(CHILD, [module], python=python, site=not sys.flags.no_site)
        done = process.run(command, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "broken", "error": f"importing {module} did not finish in time"}
    except OSError as exc:
        return {"status": "broken", "error": f"could not start {python}: {exc.strerror or exc}"}
    lines = [_json_object(line) for line in done.stdout.splitlines() if line.startswith("{")]
    last: dict[str, Any] = next((line for line in reversed(lines) if line is not None), {})
    if done.returncode < 0:
        try:
            sig = signal.Signals(-done.returncode).name
        except ValueError:
            sig = f"signal {-done.returncode}"
        return {
            "status": "broken",
            "path": last.get("path"),
            "error": f"importing {module} killed the process with {sig}"
            + (" (the binary uses instructions this CPU lacks)" if sig == "SIGILL" else ""),
        }
    if not last:
        return {"status": "broken", "error": (done.stderr or "no output").strip()[-1000:]}
    if last.get("status") == "importable":
        info = last.get("build_info", {})
        if info.get("version") != last.get("package_version"):
            return _status(
                last,
                status="stale",
                error=f"extension built for ktforge {info.get('version')}, package is {last.get('package_version')}",
            )
        return _status(last, status="ok")
    if last.get("status") == "located":
        return _status(last, status="broken", error=(done.stderr or "no output").strip()[-1000:])
    return _status(last)
