"""The machine report: one JSON document, computed from :class:`Evidence` alone.

Every consumer (doctor, the build, the import guard) reads this document; nothing
else parses /proc/cpuinfo or interprets a CPUID bit.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

from ktforge.detect import amx, blis, dumps, microarch
from ktforge.detect.cpuid import CpuidFacts, decode, leaves_from_rows
from ktforge.detect.evidence import Evidence
from ktforge.detect.features import AMX_FAMILY, AVX512_FAMILY, PYCPUINFO_SEES, REPORTED
from ktforge.detect.report_types import (
    REPORT_SCHEMA_VERSION,
    BlisSection,
    CpuSection,
    Disagreement,
    ExtensionStatus,
    MachineReport,
    MemorySection,
    NumaSection,
    OsState,
    ProbeOutcomeJson,
    ProbeSummary,
    PycpuinfoResult,
    TilePalette,
)
from ktforge.detect.system import kernel_version, parse_meminfo

__all__ = ["REPORT_SCHEMA_VERSION", "build_report"]
_HYPERVISOR_SIGNATURES = {
    "KVMKVMKVM": "KVM",
    "Microsoft Hv": "Microsoft Hyper-V",
    "VMwareVMware": "VMware",
    "XenVMMXenVMM": "Xen",
    "TCGTCGTCGTCG": "QEMU (TCG)",
    "VBoxVBoxVBox": "VirtualBox",
    " lrpepyh  vr": "Parallels",
    "ACRNACRNACRN": "ACRN",
}


def _cpuid_facts(ev: Evidence) -> tuple[CpuidFacts | None, dict[str, Any] | None, str | None]:
    """(facts, raw probe data, error) from the live probe or a recorded dump."""
    if ev.cpu_probe is not None:
        status = ev.cpu_probe.get("status")
        data = ev.cpu_probe.get("data")
        if status == "ok" and isinstance(data, dict):
            try:
                return decode(leaves_from_rows(data["leaves"]), data.get("xcr0")), data, None
            except (KeyError, ValueError) as exc:
                return None, data, f"CPU probe output unusable: {exc}"
        return None, None, f"CPU probe {status}: {ev.cpu_probe.get('detail', '')}".strip()
    if ev.cpuid_rows is not None:
        try:
            leaves = leaves_from_rows(ev.cpuid_rows)
            return decode(leaves, None), {"leaves": ev.cpuid_rows, "xcr0": None}, None
        except ValueError as exc:
            return None, None, f"CPUID dump unusable: {exc}"
    return None, None, None


def _text_facts(ev: Evidence) -> dict[str, dumps.TextCpu]:
    found: dict[str, dumps.TextCpu] = {}
    if ev.cpuinfo_text:
        found["cpuinfo"] = dumps.parse_cpuinfo(ev.cpuinfo_text)
    if ev.lscpu_json:
        with contextlib.suppress(dumps.DumpFormatError):
            found["lscpu"] = dumps.parse_lscpu_json(ev.lscpu_json)
    if "lscpu" not in found and ev.lscpu_text:
        with contextlib.suppress(dumps.DumpFormatError):
            found["lscpu"] = dumps.parse_lscpu_text(ev.lscpu_text)
    if ev.sysctl_text:
        found["sysctl"] = dumps.parse_sysctl(ev.sysctl_text)
    return found


def _hypervisor(
    cpuid_data: dict[str, Any] | None, texts: dict[str, dumps.TextCpu], features: frozenset[str]
) -> str | None:
    for row in (cpuid_data or {}).get("leaves", []):
        if row[0] == 0x40000000:
            sig = struct.pack("<III", row[3], row[4], row[5]).decode("ascii", "replace").rstrip("\x00")
            return _HYPERVISOR_SIGNATURES.get(sig, sig or "unknown")
    for text in texts.values():
        if text.hypervisor and text.hypervisor != "unknown":
            return text.hypervisor
    if "hypervisor" in features or any(t.hypervisor for t in texts.values()):
        return "unknown"
    return None


def _cpu_section(ev: Evidence) -> tuple[CpuSection, list[Disagreement]]:
    facts, cpuid_data, cpuid_error = _cpuid_facts(ev)
    texts = _text_facts(ev)
    kernel_view = texts.get("cpuinfo") or texts.get("lscpu")
    text = kernel_view or texts.get("sysctl")
    disagreements: list[Disagreement] = []

    # py-cpuinfo's CPUID: the identity when the probe could not run (no compiler yet)
    pyc = ev.pycpuinfo if ev.pycpuinfo and ev.pycpuinfo.get("status") == "ok" else None
    identity: CpuidFacts | dumps.TextCpu | None = (
        facts
        or (
            pyc
            and dumps.TextCpu(
                arch="x86_64",
                vendor=pyc["vendor"],
                brand=pyc["brand"],
                family=pyc["family"],
                model=pyc["model"],
                stepping=pyc["stepping"],
                flags=frozenset(pyc["flags"]),
            )
        )
        or text
    )
    machine = ev.system["machine"] if ev.system else None
    arch = machine or ("x86_64" if facts or pyc else None) or (text.arch if text else None)
    vendor = identity.vendor if identity else None
    family = identity.family if identity else None
    model = identity.model if identity else None
    stepping = identity.stepping if identity else None
    brand = (identity.brand if identity and identity.brand else None) or (text.brand if text else None)

    kernel_flags = kernel_view.flags if kernel_view else None
    features, usable, os_state = _feature_sets(facts, text, pyc)
    disagreements += _witness_disagreements(facts, kernel_flags, pyc, os_state)
    uarch = microarch.identify(arch, vendor, family, model, stepping, usable or ())  # what it is, unmasked
    disabled = sorted(ev.disabled_features or ())  # what may run: as if it lacked them
    usable = usable - set(disabled) if usable is not None else None
    table = uarch.get("model_table")
    hypervisor = _hypervisor(cpuid_data, texts, features or frozenset())
    if table and table["unexpected"]:
        disagreements.append(
            {
                "topic": "cpu.model",
                "detail": f"the model number says {table['name']} (family {family}, model {model}), which has no "
                f"{', '.join(table['unexpected'])}; the features say otherwise"
                + (f": the {hypervisor} hypervisor masks the model number" if hypervisor else ""),
            }
        )

    cpu: CpuSection = {
        "arch": arch,
        "vendor": vendor,
        "brand": brand,
        "family": family,
        "model": model,
        "stepping": stepping,
        "microarchitecture": uarch,
        "hypervisor": hypervisor,
        "features": sorted(features) if features is not None else None,
        "usable_features": sorted(usable) if usable is not None else None,
        "disabled_features": disabled,
        "kernel_flags_known": kernel_flags is not None,
        "reported": {
            name: {
                "cpuid": (name in facts.cpu_features) if facts else None,
                "kernel": (name in kernel_flags) if kernel_flags is not None else None,
                "usable": (name in usable) if usable is not None else None,
            }
            for name in REPORTED
        },
        "os_state": os_state,
        "tile_palette": _tile_palette(facts),
        "cpuid_source": "probe" if facts and ev.cpu_probe else "dump" if facts else "py-cpuinfo" if pyc else None,
        "cpuid_error": cpuid_error,
        "notes": list(facts.notes) if facts else [],
        "logical_cpus": text.cpus if text else None,
    }
    return cpu, disagreements


def _unknown_os_state() -> OsState:
    return {"xcr0": None, "avx": None, "avx512": None, "amx": None}


def _feature_sets(
    facts: CpuidFacts | None, text: dumps.TextCpu | None, pyc: PycpuinfoResult | None
) -> tuple[frozenset[str] | None, frozenset[str] | None, OsState]:
    """(what the CPU has, what may be used, the OS state) from the best source there is."""
    if facts is not None:
        os_state: OsState = {
            "xcr0": facts.os_state.xcr0,
            "avx": facts.os_state.avx,
            "avx512": facts.os_state.avx512,
            "amx": facts.os_state.amx,
        }
        return facts.cpu_features, facts.usable_features(), os_state
    if text is not None:
        # A text dump (or the live kernel without the probe): Linux lists a flag only once it
        # has enabled the state it needs.
        return text.flags, text.flags, _unknown_os_state()
    if pyc is not None:  # CPUID without XCR0: what the CPU has, not what the OS enabled
        return frozenset(pyc["flags"]), None, _unknown_os_state()
    return None, None, _unknown_os_state()


def _witness_disagreements(
    facts: CpuidFacts | None, kernel_flags: frozenset[str] | None, pyc: PycpuinfoResult | None, os_state: OsState
) -> list[Disagreement]:
    """Where the witnesses differ: CPUID vs the kernel's flags, py-cpuinfo vs either, the
    kernel's flags vs XCR0."""
    disagreements: list[Disagreement] = []
    if facts is not None and kernel_flags is not None:
        for name in REPORTED:
            in_cpuid, in_kernel = name in facts.cpu_features, name in kernel_flags
            if in_cpuid and not in_kernel:
                disagreements.append(
                    {
                        "topic": f"feature.{name}",
                        "detail": f"CPUID reports {name} but the kernel does not list it in /proc/cpuinfo "
                        "(disabled by the kernel, or a kernel too old to name it)",
                    }
                )
            elif in_kernel and not in_cpuid:
                disagreements.append(
                    {"topic": f"feature.{name}", "detail": f"/proc/cpuinfo lists {name} but CPUID does not report it"}
                )
    witness = facts.cpu_features if facts is not None else kernel_flags
    if pyc is not None and witness is not None:
        # one more witness: py-cpuinfo decodes leaves 1 and 7.0 itself
        against = "CPUID (probe)" if facts is not None else "/proc/cpuinfo"
        for name in sorted(PYCPUINFO_SEES):
            if (name in pyc["flags"]) != (name in witness):
                says = "reports" if name in pyc["flags"] else "does not report"
                disagreements.append(
                    {"topic": f"feature.{name}", "detail": f"py-cpuinfo's CPUID {says} {name}, unlike {against}"}
                )
    if facts is not None and kernel_flags is not None:
        if kernel_flags & AMX_FAMILY and os_state["amx"] is False:
            disagreements.append(
                {
                    "topic": "os_state.amx",
                    "detail": "the kernel lists amx_tile but XCR0 bits 17-18 are off: tiles cannot be used",
                }
            )
        if kernel_flags & AVX512_FAMILY and os_state["avx512"] is False:
            disagreements.append(
                {
                    "topic": "os_state.avx512",
                    "detail": "the kernel lists AVX-512 flags but XCR0 bits 5-7 are off: AVX-512 cannot be used",
                }
            )
    return disagreements


def _tile_palette(facts: CpuidFacts | None) -> TilePalette | None:
    if not (facts and facts.tile_palette):
        return None
    return {
        "total_tile_bytes": facts.tile_palette.total_tile_bytes,
        "bytes_per_tile": facts.tile_palette.bytes_per_tile,
        "bytes_per_row": facts.tile_palette.bytes_per_row,
        "max_names": facts.tile_palette.max_names,
        "max_rows": facts.tile_palette.max_rows,
    }


def _memory(ev: Evidence) -> MemorySection | None:
    if ev.system is None or not ev.system["meminfo"]:
        return None
    info = parse_meminfo(ev.system["meminfo"])
    thp = ev.system["thp"] or ""
    thp_mode = thp[thp.find("[") + 1 : thp.find("]")] if "[" in thp else None
    return {
        "total_bytes": info.get("MemTotal"),
        "available_bytes": info.get("MemAvailable"),
        "hugepages_total": info.get("HugePages_Total"),
        "hugepages_free": info.get("HugePages_Free"),
        "hugepage_size_bytes": info.get("Hugepagesize"),
        "transparent_hugepages": thp_mode,
    }


def _numa(ev: Evidence) -> NumaSection | None:
    system = ev.system
    if system is not None and "topology" in system:
        return system["topology"]
    if system is not None:
        return {
            "nodes": {str(k): v for k, v in (system["numa_nodes"] or {}).items()},
            "online_cpus": system["online_cpus"],
            "affinity": system["affinity"],
        }
    texts = _text_facts(ev)
    lscpu = texts.get("lscpu")
    if lscpu and lscpu.numa_nodes:
        return {"nodes": {str(k): v for k, v in lscpu.numa_nodes.items()}, "online_cpus": None, "affinity": None}
    return None


def _blis(ev: Evidence, cpu: CpuSection) -> BlisSection | None:
    if ev.blis is None:
        return None
    libraries = [blis.summarize(c) for c in ev.blis["candidates"]]
    if "avx512_vnni" in cpu["disabled_features"]:
        # AOCL's integer GEMM needs VNNI and reads the CPU itself: under a mask that hides it, as on
        # a CPU without it, no library is usable for it (the probe's right answer used VNNI)
        for lib in libraries:
            if lib["gemm_s8s8s32"] == "ok":
                lib["gemm_s8s8s32"], lib["usable"] = "hidden by cpu.mask", False
    selected = next((lib for lib in libraries if lib["usable"]), None)
    return {
        "searched": ev.blis["searched"],
        "libraries": libraries,
        "selected": selected["path"] if selected else None,
        "selected_library_dir": selected["library_dir"] if selected else None,
    }


def _extension(ev: Evidence, cpu: CpuSection) -> ExtensionStatus | None:
    if ev.extension is None:
        return None
    ext = ExtensionStatus(**ev.extension)
    info = ext.get("build_info") or {}
    usable = cpu["usable_features"]
    if usable is not None:
        have = set(usable)
        ext["missing_cpu_features"] = sorted(set(info.get("required_cpu_features") or []) - have)
        ext["backends_missing_features"] = {
            b["name"]: sorted(set(b.get("required_cpu_features") or []) - have) for b in info.get("backends") or []
        }
    return ext


def _probe_summary(outcome: ProbeOutcomeJson | None) -> ProbeSummary | None:
    return {"status": outcome.get("status"), "detail": outcome.get("detail")} if outcome else None


def build_report(ev: Evidence) -> MachineReport:
    """The facts of the machine that ``ev`` saw; the choice of backend is not made here (see
    :func:`ktforge.builder.assessment.assess`)."""
    cpu, disagreements = _cpu_section(ev)
    usable = set(cpu["usable_features"] or ())
    cpu_has_amx = None if cpu["features"] is None else "amx_tile" in cpu["features"]
    amx_info = amx.interpret(ev.amx_probe, cpu_has_amx, cpu["os_state"]["amx"])
    release = ev.system["kernel_release"] if ev.system else None
    system = ev.system["system"] if ev.system else None
    if cpu_has_amx and "amx_tile" not in usable and cpu["os_state"]["amx"] is not False:
        disagreements.append({"topic": "amx", "detail": "amx_tile reported but not usable"})
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "source": {"kind": ev.source, "origin": ev.origin},
        "cpu": cpu,
        "amx": amx_info,
        "blis": _blis(ev, cpu),
        "os": {
            "system": system
            or ("Darwin" if ev.sysctl_text else "Linux" if ev.cpuinfo_text or ev.lscpu_text or ev.lscpu_json else None),
            "kernel_release": release,
            "kernel_version": list(kv) if (kv := kernel_version(release)) else None,
            "distribution": ev.system["os_release"] if ev.system else None,
        },
        "numa": _numa(ev),
        "memory": _memory(ev),
        "toolchain": ev.toolchain,
        "extension": _extension(ev, cpu),
        "disagreements": disagreements,
        "probes": {"cpu": _probe_summary(ev.cpu_probe), "amx_permission": _probe_summary(ev.amx_probe)},
    }
