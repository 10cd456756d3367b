"""Checks of the system (NUMA, memory, hypervisor), the evidence itself and the recommended recipe."""

from __future__ import annotations

from ktforge.builder.assessment import Assessment
from ktforge.detect.microarch import spelled
from ktforge.doctor import common
from ktforge.doctor.common import GIB
from ktforge.doctor.findings import Finding, Say, check

# --- system -------------------------------------------------------------------------------


@check("system.memory", "system", "memory and huge pages")
def _memory(r: Assessment, say: Say) -> Finding:
    mem = r["memory"]
    if mem is None:
        return say("unknown", "memory is not in the evidence")
    total, avail = mem["total_bytes"] or 0, mem["available_bytes"] or 0
    text = (
        f"{total / GIB:.1f} GiB total, {avail / GIB:.1f} GiB available; "
        f"huge pages {mem['hugepages_total'] or 0} x {(mem['hugepage_size_bytes'] or 0) >> 20} MiB; "
        f"THP {mem['transparent_hugepages'] or 'unknown'}"
    )
    if avail < 4 * GIB:
        return say(
            "warn",
            text + ": under 4 GiB available, too little to build and test",
            "free memory or use a larger machine",
        )
    return say("ok", text)


@check("system.hypervisor", "system", "hypervisor hiding CPU features")
def _hypervisor(r: Assessment, say: Say) -> Finding:
    cpu = r["cpu"]
    hv = cpu["hypervisor"]
    uarch = cpu["microarchitecture"]
    name = uarch["name"]
    used = uarch.get("hidden_used_by_kernels") or []
    unused = sorted(set(uarch.get("hidden") or []) - set(used))
    also = f"; also hidden, not used by the kernels: {', '.join(unused)}" if unused else ""
    if hv is None:
        if used:
            return say(
                "warn",
                f"{spelled(name, article=True)} has {', '.join(used)}, which this machine does not show{also}",
                "check BIOS settings and kernel boot parameters (clearcpuid)",
                "cat /proc/cmdline",
            )
        return say("ok", "bare metal (no hypervisor bit)" + also)
    if used:
        return say(
            "warn",
            f"{hv} guest: {spelled(name, article=True)} has {', '.join(used)}, which this guest does not see; "
            f"the kernels can only use what the guest sees{also}",
            "give the guest the host's CPU model",
            "qemu-system-x86_64 -cpu host ...   # QEMU/KVM",
            "virsh edit VM  # <cpu mode='host-passthrough'/>   # libvirt",
        )
    closest = uarch.get("closest_newer")
    note = (
        f"; features match {spelled(closest['name'])} except {', '.join(closest['missing'])} (not used by the kernels)"
        if closest
        else ""
    )
    hidden_note = f"; the {hv} CPU model hides {', '.join(unused)} (not used by the kernels)" if unused else ""
    return say("ok", f"{hv} guest; every kernel-relevant feature is visible{note}{hidden_note}")


@check("sources.agree", "system", "CPUID, XCR0, /proc/cpuinfo and the model number agree")
def _sources(r: Assessment, say: Say) -> Finding:
    items = r["disagreements"]
    if not items:
        return say("ok", "no disagreement between the sources")
    serious = [d for d in items if d["topic"] != "cpu.model"]
    text = " | ".join(d["detail"] for d in items)
    if serious:
        return say("warn", text, "trust CPUID+XCR0 (what ktforge uses); check the kernel and VM")
    return say("info", text)


@check("probes.ran", "system", "probes compiled and ran")
def _probes(r: Assessment, say: Say) -> Finding:
    probes = common.probes_run(r)
    if not probes:
        return say("unknown", f"no probe ran (evidence from a {r['source']['kind']} dump)")
    bad = {k: v for k, v in probes.items() if v["status"] != "ok"}
    if common.no_compiler(r):
        cpuid = r["cpu"]["cpuid_source"]
        seen = "CPUID read through py-cpuinfo" if cpuid == "py-cpuinfo" else "no CPUID read (py-cpuinfo failed)"
        return say(
            "warn",
            f"no C compiler yet: {seen}, features from /proc/cpuinfo; XCR0 (the OS state), the AMX permission "
            "and the BLIS check need the probes, which are compiled on the spot",
            "install the build tools (./install.sh deps does), then run `kt doctor` again",
            *common.compiler_commands(),
        )
    if bad:
        return say(
            "warn",
            "; ".join(f"{k}: {v['status']} {v['detail']}" for k, v in bad.items()),
            "install a C compiler (probes are compiled on the spot)",
            "sudo apt-get install -y gcc",
        )
    return say("ok", ", ".join(sorted(probes)))


@check("recipe.recommended", "recipe", "recommended recipe")
def _recipe(r: Assessment, say: Say) -> Finding:
    b = r["recipe"]
    name = b["recommended"]
    rejected = [
        f"{x['name']}: {'; '.join(x['why_not'])}"
        for x in b["recipes"]
        if not x["eligible"] and x["priority"] > next((y["priority"] for y in b["recipes"] if y["name"] == name), -1)
    ]
    why = f" (not {' / '.join(rejected)})" if rejected else ""
    if name == "unknown":
        return say(
            "unknown",
            f"cannot choose: the {r['source']['kind']} does not show {'; '.join(b['unseen'])}{why}",
            "give the whole output (lscpu with its Flags line, /proc/cpuinfo), or run `kt doctor` on the machine",
            "kt doctor",
        )
    if name == "none":
        # The lowest recipe is the lowest bar: its reasons say what is missing.
        lowest = min(b["recipes"], key=lambda x: x["priority"])
        return say(
            "error",
            f"no recipe can be built here ({lowest['name']}: {'; '.join(lowest['why_not'])})",
            "ktforge needs Linux on an x86-64 CPU with at least AVX2 and FMA",
        )
    chosen = next(x for x in b["recipes"] if x["name"] == name)
    if b["provisional"]:
        return say(
            "info",
            f"{name}, provisionally: unverified {'; '.join(chosen['unverified'])}{why}",
            "run `kt doctor` on the machine itself to verify every gate",
            "kt doctor",
        )
    return say("ok", f"{name}: {chosen['summary']}{why}")
