"""Compile the C probes on the spot, cache the binaries, run them safely.

A probe is compiled with the system C compiler and no ISA flags (so it runs on any
x86-64 and decides nothing by itself), cached by the hash of its source, the
compiler's identity and the flags, and run as a child process with a timeout.
Whatever goes wrong (no compiler, a compile error, a crash, a hang, garbage output)
comes back as a :class:`ProbeOutcome` with a status; never as an exception.
"""

from __future__ import annotations

import atexit
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

from ktforge import process
from ktforge.detect.report_types import ProbeOutcomeJson
from ktforge.process import which
from ktforge.resources import data_path, file_is_ours, private_cache_dir

PROBE_FLAGS = ("-O1", "-std=gnu11")
PROBE_LIBS = {"blis": ("-ldl",)}
COMPILE_TIMEOUT_S = 30.0
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
    """$CC if set, else the first of cc, gcc, clang on PATH (its absolute entries)."""
    candidates = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for name in candidates:
        path = which(name.split()[0])
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


_scratch: list[Path] = []


def _scratch_dir() -> Path:
    """A private temporary directory of this process (removed at exit): where probes are
    compiled and run when the cache cannot be trusted or written."""
    if not _scratch:
        _scratch.append(Path(tempfile.mkdtemp(prefix="ktforge-probes-")))
        atexit.register(shutil.rmtree, _scratch[0], True)
    return _scratch[0]


def compile_probe(name: str, compiler: str | None = None) -> tuple[Path | None, ProbeOutcome | None]:
    """Return the binary of probe ``name``, compiling it if needed.

    Binaries are executed, so one is taken from the cache only when the cache directory is
    this user's and private, and the binary a regular file of this user that no other can
    write; otherwise it is compiled into a private temporary directory for this run."""
    compiler = compiler or find_c_compiler()
    if compiler is None:
        return None, ProbeOutcome("no-compiler", "no C compiler found (set CC, or install gcc: ./install.sh deps)")
    source = data_path("probes", f"{name}.c")
    flags = (*PROBE_FLAGS, *PROBE_LIBS.get(name, ()))
    try:
        identity = _compiler_identity(compiler)
    except OSError as exc:
        return None, ProbeOutcome("compile-failed", f"cannot read {compiler}: {exc.strerror or exc}")
    key = hashlib.sha256(source.read_bytes() + identity.encode() + " ".join(flags).encode()).hexdigest()[:16]
    directory = private_cache_dir("probes") or _scratch_dir()
    binary = directory / f"{name}-{key}"
    if file_is_ours(binary):
        return binary, None
    with tempfile.TemporaryDirectory(dir=directory) as tmp:  # mkdtemp: private, a name of its own
        out = Path(tmp) / name
        # Libraries go after the source: the linker resolves left to right.
        command = [compiler, *PROBE_FLAGS, "-o", str(out), str(source), *PROBE_LIBS.get(name, ())]
        try:
            done = process.run(command, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            return None, ProbeOutcome("compile-failed", f"{compiler} did not finish: {exc.output or ''}".strip())
        except OSError as exc:
            return None, ProbeOutcome("compile-failed", f"could not run {compiler}: {exc}")
        if done.returncode != 0:
            return None, ProbeOutcome(
                "compile-failed", f"{' '.join(command)}\n{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        out.chmod(0o700)
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
        # a hang is the arguments' (the BLIS library probed), not the probe's: the next may answer
        done = process.run([str(binary), *args], timeout=timeout_s, env=run_env, remember_hang=False)
    except subprocess.TimeoutExpired as exc:
        partial = exc.output if isinstance(exc.output, str) else ""
        return ProbeOutcome("timeout", f"no answer within {timeout_s:.0f} s; printed: {partial[-500:]!r}")
    except OSError as exc:
        return ProbeOutcome("crashed", f"could not run {binary}: {exc.strerror or exc}")
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
