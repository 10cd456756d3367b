"""Evidence: everything ktforge saw of a machine, raw, before any interpretation.

Live collection fills every field; ``kt doctor --from`` fills what a text dump
holds. The machine report is computed from evidence alone, so a snapshot written
by ``kt doctor --snapshot`` replays into exactly the same report.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ktforge import process
from ktforge.detect import dumps
from ktforge.detect.report_types import (
    BlisDiscovery,
    ExtensionStatus,
    ProbeOutcomeJson,
    PycpuinfoResult,
    SourceKind,
    SystemFacts,
    Toolchain,
)
from ktforge.files import UnsafePath, open_regular

SNAPSHOT_VERSION = 1


@dataclass
class Evidence:
    source: SourceKind
    origin: str | None = None  # the file it came from
    cpu_probe: ProbeOutcomeJson | None = None  # probes/cpu.c
    pycpuinfo: PycpuinfoResult | None = None  # CPUID through py-cpuinfo (ktforge.detect.pycpuinfo)
    amx_probe: ProbeOutcomeJson | None = None  # probes/amx_permission.c
    blis: BlisDiscovery | None = None
    cpuinfo_text: str | None = None
    lscpu_text: str | None = None
    lscpu_json: dict[str, Any] | None = None
    sysctl_text: str | None = None
    cpuid_rows: list[list[int]] | None = None
    system: SystemFacts | None = None
    toolchain: Toolchain | None = None
    extension: ExtensionStatus | None = None
    disabled_features: list[str] | None = None  # KTFORGE_DISABLE_CPU_FEATURES (ktforge.detect.mask)

    def to_snapshot(self) -> dict[str, Any]:
        return {"ktforge_snapshot": SNAPSHOT_VERSION, "evidence": asdict(self)}

    def not_seen_by_source(self) -> list[str]:
        """What this source could not show: the facts only the probes read."""
        missing = []
        if self.cpu_probe is None:
            missing.append("XCR0 (the OS register state; a text dump implies it from the kernel's flags)")
        if self.amx_probe is None:
            missing.append("AMX permission (arch_prctl) and a tile execution proof")
        if self.blis is None:
            missing.append("BLIS libraries (which one has a working aocl_gemm add-on)")
        return missing

    @staticmethod
    def from_snapshot(document: dict[str, Any], origin: str | None = None) -> Evidence:
        version = document.get("ktforge_snapshot")
        if version != SNAPSHOT_VERSION:
            raise dumps.DumpFormatError(
                f"snapshot format {version!r} is not supported (this ktforge reads {SNAPSHOT_VERSION})"
            )
        raw = document.get("evidence")
        if not isinstance(raw, dict):
            raise dumps.DumpFormatError('a snapshot holds an "evidence" object')
        known = {f.name for f in fields(Evidence)}
        evidence = Evidence(**{k: v for k, v in raw.items() if k in known})
        evidence.source = "snapshot"  # replayed, whatever it was recorded from
        evidence.origin = origin or evidence.origin
        return evidence


def from_text(text: str, origin: str | None = None) -> Evidence:
    """Evidence from a file given to ``kt doctor --from`` (format recognised by content)."""
    kind = dumps.sniff(text)
    if kind == "snapshot":
        return Evidence.from_snapshot(dumps.json_document(text), origin)
    if kind == "lscpu-json":
        return Evidence(source="lscpu-json", origin=origin, lscpu_json=dumps.json_document(text))
    if kind == "cpuid-dump":
        return Evidence(source="cpuid-dump", origin=origin, cpuid_rows=dumps.parse_cpuid_rows(text))
    if kind == "sysctl":
        return Evidence(source="sysctl", origin=origin, sysctl_text=text)
    if kind == "cpuinfo":
        return Evidence(source="cpuinfo", origin=origin, cpuinfo_text=text)
    return Evidence(source="lscpu", origin=origin, lscpu_text=text)


# The largest dump read: /proc/cpuinfo of a 1,024-CPU machine is about 1.6 MB; a snapshot a few.
MAX_DUMP_BYTES = 64 * 2**20


def from_file(path: str | Path) -> Evidence:
    """Evidence from a regular file of at most MAX_DUMP_BYTES (never /dev/zero, a FIFO or a
    terminal: those could be read forever)."""
    try:
        with open_regular(Path(path)) as handle:
            info = os.fstat(handle.fileno())
            if info.st_size > MAX_DUMP_BYTES:
                raise dumps.DumpFormatError(
                    f"{path} is {info.st_size / 2**20:.0f} MiB; a dump is at most {MAX_DUMP_BYTES // 2**20} MiB"
                )
            data = handle.read(MAX_DUMP_BYTES + 1)
    except UnsafePath:
        raise dumps.DumpFormatError(f"{path} is not a regular file (a dump is a file: save the output first)") from None
    except OSError as exc:
        raise dumps.DumpFormatError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_DUMP_BYTES:  # it grew while being read
        raise dumps.DumpFormatError(f"{path} is larger than {MAX_DUMP_BYTES // 2**20} MiB")
    return from_text(data.decode("utf-8", errors="replace"), str(path))


def _command_output(command: list[str]) -> str | None:
    try:
        done = process.run(command, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# The most that live collection waits on external commands, in total (a hung compiler or
# library costs one timeout each, then the rest is reported as not answered).
LIVE_BUDGET_S = 90.0


def collect_live(with_blis: bool = True) -> Evidence:
    """Run every probe and read every source on this machine, within LIVE_BUDGET_S."""
    with process.time_budget(LIVE_BUDGET_S):
        return _collect_live(with_blis)


def _collect_live(with_blis: bool) -> Evidence:
    from ktforge.detect import blis, extension, mask, pycpuinfo, system, toolchain
    from ktforge.detect.cpuid import decode, leaves_from_rows
    from ktforge.detect.probe_runner import run_probe

    cpu = run_probe("cpu")
    amx_args: list[str] = []
    if cpu.ok and cpu.data:
        facts = decode(leaves_from_rows(cpu.data.get("leaves", [])), cpu.data.get("xcr0"))
        # The execution proof is attempted only when CPUID and XCR0 both say AMX is there.
        if "amx_tile" in facts.cpu_features and facts.os_state.amx:
            amx_args = ["--prove"]
    amx = run_probe("amx_permission", amx_args)
    lscpu_json_text = _command_output(["lscpu", "-J"])
    try:
        lscpu_json = json.loads(lscpu_json_text) if lscpu_json_text else None
    except json.JSONDecodeError:
        lscpu_json = None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = None
    return Evidence(
        source="live",
        cpu_probe=cpu.to_json(),
        pycpuinfo=pycpuinfo.collect(),
        amx_probe=amx.to_json(),
        blis=blis.discover() if with_blis else None,
        cpuinfo_text=cpuinfo,
        lscpu_text=_command_output(["lscpu"]),
        lscpu_json=lscpu_json,
        system=system.collect(),
        toolchain=toolchain.collect(),
        extension=extension.inspect(),
        disabled_features=mask.from_environment(),
    )
