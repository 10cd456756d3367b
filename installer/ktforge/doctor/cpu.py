"""Checks of the platform, the CPU, the OS register state and AMX."""

from __future__ import annotations

from ktforge.builder.assessment import Assessment
from ktforge.doctor import common
from ktforge.doctor.findings import Finding, Say, check
from ktforge.remedies import remedy

# --- platform -----------------------------------------------------------------------------


@check("platform.x86_64", "platform", "x86-64 processor")
def _platform_arch(r: Assessment, say: Say) -> Finding:
    arch = r["cpu"]["arch"]
    if arch is None:
        return say("unknown", "the architecture is not in the evidence")
    if arch == "x86_64":
        return say("ok", "x86-64")
    fix = remedy("arch")
    return say("error", f"this is {arch}: ktforge's kernels are x86-64 only", fix.text, *fix.commands)


@check("platform.linux", "platform", "Linux")
def _platform_linux(r: Assessment, say: Say) -> Finding:
    system = r["os"]["system"]
    if system is None:
        return say("unknown", "the operating system is not in the evidence")
    if system == "Linux":
        dist = (r["os"].get("distribution") or {}).get("name")
        release = r["os"].get("kernel_release")
        return say("ok", ", ".join(x for x in ("Linux", release, dist) if x))
    fix = remedy("system")
    return say("error", f"this is {system}: ktforge supports Linux only", fix.text, *fix.commands)


# --- cpu ----------------------------------------------------------------------------------


@check("cpu.mask", "cpu", "CPU features disabled (KTFORGE_DISABLE_CPU_FEATURES)")
def _cpu_mask(r: Assessment, say: Say) -> Finding:
    disabled = r["cpu"]["disabled_features"]
    if not disabled:
        return say("ok", "none: every feature the CPU and OS allow may run")
    fix = remedy("cpu_mask")
    return say(
        "warn",
        f"{', '.join(disabled)} disabled in this process: ktforge builds, chooses and runs its kernels as on a "
        "CPU without them",
        fix.text,
        *fix.commands,
    )


@check("cpu.avx2_fma", "cpu", "AVX2 and FMA")
def _cpu_avx2(r: Assessment, say: Say) -> Finding:
    usable = common.usable(r)
    if usable is None or common.is_x86(r) is None:
        return say("unknown", "CPU features are not in the evidence")
    if not common.is_x86(r):
        return say("info", "not an x86-64 CPU")
    missing = [f for f in ("avx2", "fma", "f16c") if f not in usable]
    if not missing:
        return say("ok", "avx2, fma, f16c")
    if set(missing) <= set(r["cpu"]["disabled_features"]):
        return say("warn", f"{', '.join(missing)} disabled (cpu.mask): only the reference backend runs")
    return say(
        "error",
        f"missing {', '.join(missing)}: no ktforge backend can run",
        "use a CPU from 2013 or later (Intel Haswell / AMD Zen); in a VM, expose the host CPU",
        "qemu-system-x86_64 -cpu host ...",
    )


@check("cpu.avx512", "cpu", "AVX-512 subsets")
def _cpu_avx512(r: Assessment, say: Say) -> Finding:
    usable = common.usable(r)
    if usable is None:
        return say("unknown", "CPU features are not in the evidence")
    if not common.is_x86(r):
        return say("info", "not an x86-64 CPU")
    core = ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
    extras = ["avx512cd", "avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512_bf16", "avx512_fp16"]
    missing = [f for f in core if f not in usable]
    if missing:
        cpu_has = [f for f in core if f in (r["cpu"]["features"] or [])]
        if cpu_has and r["cpu"]["os_state"]["avx512"] is False:
            return say("error", "the CPU has AVX-512 but the OS has not enabled its state", "see os.xcr0")
        return say("info", f"no AVX-512 ({', '.join(missing)} missing): the AVX2 path will be used")
    have = [f for f in extras if f in usable]
    lacking = [f for f in extras if f not in usable]
    text = "F/BW/VL/DQ" + (f"; also {', '.join(have)}" if have else "")
    if lacking:
        text += f"; not {', '.join(lacking)}"
    if "avx512_bf16" not in usable or "avx512_vnni" not in usable:
        text += " (exact fallbacks replace the missing dot-product instructions)"
    return say("ok", text)


@check("os.xcr0", "cpu", "OS register state (XCR0)")
def _os_xcr0(r: Assessment, say: Say) -> Finding:
    state = r["cpu"]["os_state"]
    if state["xcr0"] is None:
        why = "XCR0 was not read (text dump)" if r["source"]["kind"] != "live" else "XCR0 could not be read"
        return say("unknown", why + "; the kernel's flag list implies what it enabled")
    on = [name for name in ("avx", "avx512", "amx") if state[name]]
    off = [name for name in ("avx", "avx512", "amx") if state[name] is False]
    features = set(r["cpu"]["features"] or [])
    needed_off = [
        n
        for n in off
        if (n == "avx512" and "avx512f" in features)
        or (n == "amx" and "amx_tile" in features)
        or (n == "avx" and "avx" in features)
    ]
    text = f"XCR0=0x{state['xcr0']:x}: {', '.join(on) or 'nothing'} enabled"
    if needed_off:
        fix = remedy("os_state")
        return say(
            "error", text + f"; the CPU has {', '.join(needed_off)} but the OS left it off", fix.text, *fix.commands
        )
    return say("ok", text)


# --- amx ----------------------------------------------------------------------------------


@check("amx.cpuid", "amx", "AMX in CPUID")
def _amx_cpuid(r: Assessment, say: Say) -> Finding:
    has = common.has_amx_cpu(r)
    if has is None:
        return say("unknown", "CPU features are not in the evidence")
    if not has:
        return say("info", "this CPU has no AMX (Intel Sapphire Rapids and newer have it)")
    features = set(r["cpu"]["features"] or [])
    parts = [f for f in ("amx_tile", "amx_int8", "amx_bf16", "amx_fp16") if f in features]
    palette = r["cpu"].get("tile_palette")
    geometry = (
        (f"; palette 1: {palette['max_names']} tiles of {palette['max_rows']} rows x {palette['bytes_per_row']} bytes")
        if palette
        else ""
    )
    return say("ok", ", ".join(parts) + geometry)


@check("amx.xcr0", "amx", "AMX tile state enabled (XCR0 bits 17-18)")
def _amx_xcr0(r: Assessment, say: Say) -> Finding:
    has, amx_state = common.has_amx_cpu(r), r["cpu"]["os_state"]["amx"]
    if has is False:
        return say("info", "not applicable: no AMX on this CPU")
    if amx_state is None:
        return say("unknown", "XCR0 was not read")
    if amx_state:
        return say("ok", "XTILECFG and XTILEDATA enabled")
    fix = remedy("os_state.amx")
    return say("error", "the CPU has AMX but the kernel did not enable tile state", fix.text, *fix.commands)


@check("amx.kernel", "amx", "kernel AMX support (>= 5.16, ARCH_GET_XCOMP_SUPP)")
def _amx_kernel(r: Assessment, say: Say) -> Finding:
    version = r["os"]["kernel_version"]
    amx_info = r["amx"]
    has = common.has_amx_cpu(r)
    supp = amx_info.get("supported_mask")
    if version is None and supp is None:
        return say("unknown", "the kernel version is not in the evidence")
    release = r["os"]["kernel_release"] or "unknown"
    old = version is not None and tuple(version) < (5, 16)
    offers = supp is not None and bool(supp & (1 << 18))
    if has is False:
        return say("info", f"Linux {release}; not needed: no AMX on this CPU")
    if old or amx_info["verdict"] == "kernel-unsupported":
        return say(
            "error",
            f"Linux {release} cannot hand out AMX tile state",
            "upgrade to Linux 5.16 or newer (distribution kernels: Ubuntu 22.04 HWE, RHEL 9, Debian 12)",
        )
    if supp is None:
        return say("unknown", f"Linux {release}; ARCH_GET_XCOMP_SUPP was not asked")
    return say(
        "ok" if offers else "error",
        f"Linux {release}; supported xfeatures 0x{supp:x}" + ("" if offers else " (no XTILEDATA)"),
        "" if offers else "use a kernel built with AMX support (CONFIG_X86_64, >= 5.16)",
    )


@check("amx.permission", "amx", "AMX permission (ARCH_REQ_XCOMP_PERM)")
def _amx_permission(r: Assessment, say: Say) -> Finding:
    a = r["amx"]
    if a["probe_status"] is None:
        return say("unknown" if common.has_amx_cpu(r) is not False else "info", a["explanation"])
    if a["probe_status"] == "no-compiler":
        if common.has_amx_cpu(r) is False:
            return say("info", "not needed: this CPU has no AMX (the probe needs a C compiler)")
        return say(
            "unknown",
            "not asked: the permission probe is compiled on the spot and there is no C compiler yet",
            "install the build tools, then run `kt doctor` again",
            *common.compiler_commands(),
        )
    if a["verdict"] == "probe-failed":
        return say("warn", a["explanation"], "run `kt doctor --json` and report the probe detail")
    if a["permitted"]:
        return say(
            "ok",
            f"granted: XTILEDATA permitted (0x{a['permitted_before'] or 0:x} -> 0x{a['permitted_after'] or 0:x})",
        )
    if common.has_amx_cpu(r) is False:
        return say("info", a["explanation"])
    return say(
        "error",
        a["explanation"],
        "AMX needs the permission; check seccomp profiles (containers) and the kernel version",
    )


@check("amx.execution", "amx", "AMX execution proof")
def _amx_execution(r: Assessment, say: Say) -> Finding:
    a = r["amx"]
    if common.has_amx_cpu(r) is False:
        return say("info", "not attempted: no AMX on this CPU")
    execution = a.get("execution")
    if execution == "ok":
        return say("ok", "ldtilecfg, tilezero, tilestored, tilerelease ran and stored zeros")
    if execution in (None, "not-attempted"):
        return say("unknown", "not attempted: " + a["explanation"])
    return say(
        "error",
        f"tile instructions failed: {execution}",
        "the CPU or hypervisor advertises AMX it cannot execute; in a VM pass the host CPU through",
    )
