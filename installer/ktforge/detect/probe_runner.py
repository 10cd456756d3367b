"""Compile the C probes on the spot, cache the binaries, run them safely.

A probe is compiled with the system C compiler and no ISA flags (so it runs on any
x86-64 and decides nothing by itself), cached by the hash of its source, the
compiler's identity and the flags, and run as a child process with a timeout.
Whatever goes wrong (no compiler, a compile error, a crash, a hang, garbage output)
comes back as a :class:`ProbeOutcome` with a status; never as an exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ktforge.detect.report_types import ProbeOutcomeJson
from ktforge.resources import cache_dir, data_path

PROBE_FLAGS = ("-O1", "-std=gnu11")
PROBE_LIBS = {"blis": ("-ldl",)}
COMPILE_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class ProbeOutcome:
    """The result of one probe: ``status`` is ok, no-compiler, compile-failed, crashed,
    timeout or bad-output; ``data`` is the probe's JSON when it printed any."""

    status: str
    detail: str = ""
    data: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> ProbeOutcomeJson:
        return {"status": self.status, "detail": self.detail, "data": self.data}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> ProbeOutcome:
        data = doc.get("data")
        return ProbeOutcome(
            str(doc.get("status", "unknown")),
            str(doc.get("detail", "")),
            dict(data) if isinstance(data, dict) else None,
        )


def find_c_compiler() -> str | None:
    """$CC if set, else the first of cc, gcc, clang on PATH."""
    candidates = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name.split()[0])
        if path:
            return path
    return None


def _compiler_identity(compiler: str) -> str:
    stat = Path(compiler).resolve().stat()
    return f"{Path(compiler).resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def compile_probe(name: str, compiler: str | None = None) -> tuple[Path | None, ProbeOutcome | None]:
    """Return the cached binary of probe ``name``, compiling it if needed."""
    compiler = compiler or find_c_compiler()
    if compiler is None:
        return None, ProbeOutcome("no-compiler", "no C compiler found (set CC, or install gcc: ./install.sh deps)")
    source = data_path("probes", f"{name}.c")
    flags = (*PROBE_FLAGS, *PROBE_LIBS.get(name, ()))
    key = hashlib.sha256(
        source.read_bytes() + _compiler_identity(compiler).encode() + " ".join(flags).encode()
    ).hexdigest()[:16]
    binary = cache_dir() / "probes" / f"{name}-{key}"
    if binary.exists():
        return binary, None
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as tmp:
        out = Path(tmp) / name
        # Libraries go after the source: the linker resolves left to right.
        command = [compiler, *PROBE_FLAGS, "-o", str(out), str(source), *PROBE_LIBS.get(name, ())]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, ProbeOutcome("compile-failed", f"{compiler} took over {COMPILE_TIMEOUT_S:.0f} s")
        except OSError as exc:
            return None, ProbeOutcome("compile-failed", f"could not run {compiler}: {exc}")
        if done.returncode != 0:
            return None, ProbeOutcome(
                "compile-failed", f"{' '.join(command)}\n{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        out.replace(binary)  # atomic: concurrent runs never see half a binary
    return binary, None


def run_probe(
    name: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> ProbeOutcome:
    binary, failure = compile_probe(name)
    if failure is not None or binary is None:
        return failure or ProbeOutcome("compile-failed", "no binary")
    run_env = dict(os.environ)
    run_env.update(env or {})
    try:
        done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout_s, env=run_env)
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return ProbeOutcome("timeout", f"no answer within {timeout_s:.0f} s; printed: {partial[-500:]!r}")
    if done.returncode < 0:
        return ProbeOutcome(
            "crashed",
            f"killed by {_signal_name(done.returncode)}; printed: {done.stdout[-500:]!r}",
            _partial_json(done.stdout),
        )
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        return ProbeOutcome(
            "bad-output", f"exit {done.returncode}; printed {done.stdout[-500:]!r}; {done.stderr[-500:]!r}"
        )
    if not isinstance(data, dict):
        return ProbeOutcome("bad-output", f"expected a JSON object, got {type(data).__name__}")
    if done.returncode != 0:
        return ProbeOutcome("failed", str(data.get("error", f"exit {done.returncode}")), data)
    return ProbeOutcome("ok", "", data)


def _partial_json(text: str) -> dict[str, Any] | None:
    """A probe that flushed part of its object before crashing: close it and read what it said."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text + "}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
