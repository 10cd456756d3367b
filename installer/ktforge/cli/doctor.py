"""``kt doctor`` findings: every gate between this machine and fast, correct kernels.

Each check reads the machine report (never the machine) and returns a
:class:`Finding` with a stable id, a status (ok, info, warn, error, unknown), what
was found and, for anything not ok, the remedy and the exact commands.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal, TypedDict, get_args

from ktforge.builder import backends as backends_table
from ktforge.builder.assessment import Assessment
from ktforge.detect.blis import AOCL_INT8_NEEDS
from ktforge.detect.report_types import BlisSection, Compiler, ProbeSummary, Schema

FindingStatus = Literal["ok", "info", "warn", "error", "unknown"]
STATUSES: tuple[FindingStatus, ...] = get_args(FindingStatus)
# a check id: category.name
FindingId = Annotated[str, Schema(keywords={"pattern": r"^[a-z0-9_]+\.[a-z0-9_]+$"})]


class FindingJson(TypedDict):
    id: FindingId
    category: str
    status: FindingStatus
    title: str
    finding: str
    remedy: str
    commands: list[str]


class Summary(TypedDict):
    ok: int
    info: int
    warn: int
    error: int
    unknown: int


GIB = 1 << 30


@dataclass(frozen=True)
class Finding:
    id: str
    category: str
    status: FindingStatus
    title: str
    finding: str
    remedy: str = ""
    commands: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> FindingJson:
        return {
            "id": self.id,
            "category": self.category,
            "status": self.status,
            "title": self.title,
            "finding": self.finding,
            "remedy": self.remedy,
            "commands": list(self.commands),
        }


Check = Callable[[Assessment], Finding]
_REGISTRY: list[tuple[str, str, str, Check]] = []


def check(check_id: str, category: str, title: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        _REGISTRY.append((check_id, category, title, fn))
        return fn

    return register


def list_checks() -> list[tuple[str, str, str]]:
    return [(cid, cat, title) for cid, cat, title, _ in _REGISTRY]


def _f(cid: str, status: FindingStatus, finding: str, remedy: str = "", *commands: str) -> Finding:
    _, category, title, _ = next(entry for entry in _REGISTRY if entry[0] == cid)
    return Finding(cid, category, status, title, finding, remedy, tuple(commands))


def _usable(r: Assessment) -> set[str] | None:
    usable = r["cpu"]["usable_features"]
    return set(usable) if usable is not None else None


def _is_x86(r: Assessment) -> bool | None:
    arch = r["cpu"]["arch"]
    return None if arch is None else arch == "x86_64"


def _has_amx_cpu(r: Assessment) -> bool | None:
    features = r["cpu"]["features"]
    return None if features is None else "amx_tile" in features


def _probes_run(r: Assessment) -> dict[str, ProbeSummary]:
    """The probes that ran, by name."""
    found = {"cpu": r["probes"]["cpu"], "amx_permission": r["probes"]["amx_permission"]}
    return {name: summary for name, summary in found.items() if summary is not None}


def _no_compiler(r: Assessment) -> bool:
    """The probes could not be compiled: no C compiler yet (a fresh server before deps)."""
    return any(p["status"] == "no-compiler" for p in _probes_run(r).values())


def _compiler_commands() -> tuple[str, ...]:
    """./install.sh deps, and the package manager's own command from the same table."""
    from ktforge.builder import sysdeps

    try:
        direct = [shlex.join(c) for c in sysdeps.commands(["cc", "cxx"], sysdeps.distribution_ids())]
    except LookupError:
        direct = []
    return ("./install.sh deps", *direct)


def _amd(r: Assessment) -> bool:
    return bool(r["cpu"]["vendor"] == "AuthenticAMD")


# --- platform -----------------------------------------------------------------------------


@check("platform.x86_64", "platform", "x86-64 processor")
def _platform_arch(r: Assessment) -> Finding:
    arch = r["cpu"]["arch"]
    if arch is None:
        return _f("platform.x86_64", "unknown", "the architecture is not in the evidence")
    if arch == "x86_64":
        return _f("platform.x86_64", "ok", "x86-64")
    return _f(
        "platform.x86_64",
        "error",
        f"this is {arch}: ktforge's kernels are x86-64 only",
        "run ktforge on an x86-64 machine (Intel Xeon or AMD EPYC)",
    )


@check("platform.linux", "platform", "Linux")
def _platform_linux(r: Assessment) -> Finding:
    system = r["os"]["system"]
    if system is None:
        return _f("platform.linux", "unknown", "the operating system is not in the evidence")
    if system == "Linux":
        dist = (r["os"].get("distribution") or {}).get("name")
        release = r["os"].get("kernel_release")
        return _f("platform.linux", "ok", ", ".join(x for x in ("Linux", release, dist) if x))
    return _f(
        "platform.linux",
        "error",
        f"this is {system}: ktforge supports Linux only",
        "use a Linux machine (AMX also needs Linux >= 5.16)",
    )


# --- cpu ----------------------------------------------------------------------------------


@check("cpu.avx2_fma", "cpu", "AVX2 and FMA")
def _cpu_avx2(r: Assessment) -> Finding:
    usable = _usable(r)
    if usable is None or _is_x86(r) is None:
        return _f("cpu.avx2_fma", "unknown", "CPU features are not in the evidence")
    if not _is_x86(r):
        return _f("cpu.avx2_fma", "info", "not an x86-64 CPU")
    missing = [f for f in ("avx2", "fma", "f16c") if f not in usable]
    if not missing:
        return _f("cpu.avx2_fma", "ok", "avx2, fma, f16c")
    return _f(
        "cpu.avx2_fma",
        "error",
        f"missing {', '.join(missing)}: no ktforge backend can run",
        "use a CPU from 2013 or later (Intel Haswell / AMD Zen); in a VM, expose the host CPU",
        "qemu-system-x86_64 -cpu host ...",
    )


@check("cpu.avx512", "cpu", "AVX-512 subsets")
def _cpu_avx512(r: Assessment) -> Finding:
    usable = _usable(r)
    if usable is None:
        return _f("cpu.avx512", "unknown", "CPU features are not in the evidence")
    if not _is_x86(r):
        return _f("cpu.avx512", "info", "not an x86-64 CPU")
    core = ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
    extras = ["avx512cd", "avx512_vnni", "avx512vbmi", "avx512_vbmi2", "avx512_bf16", "avx512_fp16"]
    missing = [f for f in core if f not in usable]
    if missing:
        cpu_has = [f for f in core if f in (r["cpu"]["features"] or [])]
        if cpu_has and r["cpu"]["os_state"]["avx512"] is False:
            return _f("cpu.avx512", "error", "the CPU has AVX-512 but the OS has not enabled its state", "see os.xcr0")
        return _f("cpu.avx512", "info", f"no AVX-512 ({', '.join(missing)} missing): the AVX2 path will be used")
    have = [f for f in extras if f in usable]
    lacking = [f for f in extras if f not in usable]
    text = "F/BW/VL/DQ" + (f"; also {', '.join(have)}" if have else "")
    if lacking:
        text += f"; not {', '.join(lacking)}"
    if "avx512_bf16" not in usable or "avx512_vnni" not in usable:
        text += " (exact fallbacks replace the missing dot-product instructions)"
    return _f("cpu.avx512", "ok", text)


@check("os.xcr0", "cpu", "OS register state (XCR0)")
def _os_xcr0(r: Assessment) -> Finding:
    state = r["cpu"]["os_state"]
    if state["xcr0"] is None:
        why = "XCR0 was not read (text dump)" if r["source"]["kind"] != "live" else "XCR0 could not be read"
        return _f("os.xcr0", "unknown", why + "; the kernel's flag list implies what it enabled")
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
        return _f(
            "os.xcr0",
            "error",
            text + f"; the CPU has {', '.join(needed_off)} but the OS left it off",
            "boot without 'noxsave'/'clearcpuid', use a kernel that supports the state "
            "(AMX: >= 5.16), and in a VM pass the host CPU through",
            "cat /proc/cmdline",
        )
    return _f("os.xcr0", "ok", text)


# --- amx ----------------------------------------------------------------------------------


@check("amx.cpuid", "amx", "AMX in CPUID")
def _amx_cpuid(r: Assessment) -> Finding:
    has = _has_amx_cpu(r)
    if has is None:
        return _f("amx.cpuid", "unknown", "CPU features are not in the evidence")
    if not has:
        return _f("amx.cpuid", "info", "this CPU has no AMX (Intel Sapphire Rapids and newer have it)")
    features = set(r["cpu"]["features"] or [])
    parts = [f for f in ("amx_tile", "amx_int8", "amx_bf16", "amx_fp16") if f in features]
    palette = r["cpu"].get("tile_palette")
    geometry = (
        (f"; palette 1: {palette['max_names']} tiles of {palette['max_rows']} rows x {palette['bytes_per_row']} bytes")
        if palette
        else ""
    )
    return _f("amx.cpuid", "ok", ", ".join(parts) + geometry)


@check("amx.xcr0", "amx", "AMX tile state enabled (XCR0 bits 17-18)")
def _amx_xcr0(r: Assessment) -> Finding:
    has, amx_state = _has_amx_cpu(r), r["cpu"]["os_state"]["amx"]
    if has is False:
        return _f("amx.xcr0", "info", "not applicable: no AMX on this CPU")
    if amx_state is None:
        return _f("amx.xcr0", "unknown", "XCR0 was not read")
    if amx_state:
        return _f("amx.xcr0", "ok", "XTILECFG and XTILEDATA enabled")
    return _f(
        "amx.xcr0",
        "error",
        "the CPU has AMX but the kernel did not enable tile state",
        "use Linux >= 5.16 built with AMX support; in a VM, pass the host CPU through",
        "uname -r",
    )


@check("amx.kernel", "amx", "kernel AMX support (>= 5.16, ARCH_GET_XCOMP_SUPP)")
def _amx_kernel(r: Assessment) -> Finding:
    version = r["os"]["kernel_version"]
    amx_info = r["amx"]
    has = _has_amx_cpu(r)
    supp = amx_info.get("supported_mask")
    if version is None and supp is None:
        return _f("amx.kernel", "unknown", "the kernel version is not in the evidence")
    release = r["os"]["kernel_release"] or "unknown"
    old = version is not None and tuple(version) < (5, 16)
    offers = supp is not None and bool(supp & (1 << 18))
    if has is False:
        return _f("amx.kernel", "info", f"Linux {release}; not needed: no AMX on this CPU")
    if old or amx_info["verdict"] == "kernel-unsupported":
        return _f(
            "amx.kernel",
            "error",
            f"Linux {release} cannot hand out AMX tile state",
            "upgrade to Linux 5.16 or newer (distribution kernels: Ubuntu 22.04 HWE, RHEL 9, Debian 12)",
        )
    if supp is None:
        return _f("amx.kernel", "unknown", f"Linux {release}; ARCH_GET_XCOMP_SUPP was not asked")
    return _f(
        "amx.kernel",
        "ok" if offers else "error",
        f"Linux {release}; supported xfeatures 0x{supp:x}" + ("" if offers else " (no XTILEDATA)"),
        "" if offers else "use a kernel built with AMX support (CONFIG_X86_64, >= 5.16)",
    )


@check("amx.permission", "amx", "AMX permission (ARCH_REQ_XCOMP_PERM)")
def _amx_permission(r: Assessment) -> Finding:
    a = r["amx"]
    if a["probe_status"] is None:
        return _f("amx.permission", "unknown" if _has_amx_cpu(r) is not False else "info", a["explanation"])
    if a["probe_status"] == "no-compiler":
        if _has_amx_cpu(r) is False:
            return _f("amx.permission", "info", "not needed: this CPU has no AMX (the probe needs a C compiler)")
        return _f(
            "amx.permission",
            "unknown",
            "not asked: the permission probe is compiled on the spot and there is no C compiler yet",
            "install the build tools, then run `kt doctor` again",
            *_compiler_commands(),
        )
    if a["verdict"] == "probe-failed":
        return _f("amx.permission", "warn", a["explanation"], "run `kt doctor --json` and report the probe detail")
    if a["permitted"]:
        return _f(
            "amx.permission",
            "ok",
            f"granted: XTILEDATA permitted (0x{a['permitted_before'] or 0:x} -> 0x{a['permitted_after'] or 0:x})",
        )
    if _has_amx_cpu(r) is False:
        return _f("amx.permission", "info", a["explanation"])
    return _f(
        "amx.permission",
        "error",
        a["explanation"],
        "AMX needs the permission; check seccomp profiles (containers) and the kernel version",
    )


@check("amx.execution", "amx", "AMX execution proof")
def _amx_execution(r: Assessment) -> Finding:
    a = r["amx"]
    if _has_amx_cpu(r) is False:
        return _f("amx.execution", "info", "not attempted: no AMX on this CPU")
    execution = a.get("execution")
    if execution == "ok":
        return _f("amx.execution", "ok", "ldtilecfg, tilezero, tilestored, tilerelease ran and stored zeros")
    if execution in (None, "not-attempted"):
        return _f("amx.execution", "unknown", "not attempted: " + a["explanation"])
    return _f(
        "amx.execution",
        "error",
        f"tile instructions failed: {execution}",
        "the CPU or hypervisor advertises AMX it cannot execute; in a VM pass the host CPU through",
    )


# --- blis ---------------------------------------------------------------------------------

_BLIS_REMEDY = "install AOCL-BLAS with the aocl_gemm add-on (the `aoclda` wheel ships one)"
_BLIS_COMMAND = "python -m pip install aoclda"
_BLIS_UNPROBED = "not checked: the BLIS probe (which loads each library and runs a GEMM) needs a C compiler"


def _blis_unprobed(b: BlisSection) -> bool:
    return any(lib["probe_status"] == "no-compiler" for lib in b["libraries"])


@check("blis.found", "blis", "BLIS library")
def _blis_found(r: Assessment) -> Finding:
    b = r["blis"]
    if b is None:
        return _f("blis.found", "unknown", "no evidence of BLIS (text dumps carry none)")
    if _blis_unprobed(b):
        return _f("blis.found", "unknown", _BLIS_UNPROBED, "install the build tools", *_compiler_commands())
    libs = b["libraries"]
    if not libs:
        status: FindingStatus = "warn" if _amd(r) else "info"
        return _f(
            "blis.found",
            status,
            f"no BLIS library in {len(b['searched'])} searched directories"
            + (": the amd-blis backend is unavailable" if _amd(r) else ""),
            _BLIS_REMEDY + " or set BLIS_ROOT/AOCL_ROOT",
            _BLIS_COMMAND,
        )
    described = "; ".join(f"{lib['path']} ({lib['version'] or 'version unknown'}, {lib['threading']})" for lib in libs)
    broken = [lib for lib in libs if not lib["loaded"]]
    if len(broken) == len(libs):
        return _f(
            "blis.found",
            "warn",
            f"found but none loads: {broken[0]['load_error']}",
            "reinstall the library or fix its dependencies",
            f"ldd {broken[0]['path']}",
        )
    return _f("blis.found", "ok", described)


@check("blis.addon", "blis", "aocl_gemm (LPGEMM) add-on")
def _blis_addon(r: Assessment) -> Finding:
    b = r["blis"]
    if b is None:
        return _f("blis.addon", "unknown", "no evidence of BLIS (text dumps carry none)")
    if _blis_unprobed(b):
        return _f("blis.addon", "unknown", _BLIS_UNPROBED, "install the build tools", *_compiler_commands())
    with_addon = [lib for lib in b["libraries"] if lib["has_addon"]]
    if with_addon:
        lib = with_addon[0]
        extra = [s for s in ("aocl_gemm_bf16bf16f32of32", "aocl_gemm_bf16s4f32of32") if lib["symbols"].get(s)]
        return _f(
            "blis.addon",
            "ok",
            f"{lib['path']} exports aocl_gemm_s8s8s32os32 and its reorder API"
            + (f"; also {', '.join(extra)}" if extra else "")
            + ("" if lib["header"] else "; no blis.h (ktforge declares the API itself)"),
        )
    status: FindingStatus = "warn" if _amd(r) else "info"
    if b["libraries"]:
        names = ", ".join(lib["path"] for lib in b["libraries"])
        return _f(
            "blis.addon",
            status,
            f"{names}: upstream BLIS without the aocl_gemm add-on (Debian's libblis is built this way)",
            _BLIS_REMEDY,
            _BLIS_COMMAND,
        )
    return _f("blis.addon", status, "no BLIS library, so no add-on", _BLIS_REMEDY, _BLIS_COMMAND)


@check("blis.gemm", "blis", "aocl_gemm s8s8s32 GEMM runs and is correct")
def _blis_gemm(r: Assessment) -> Finding:
    b = r["blis"]
    if b is None:
        return _f("blis.gemm", "unknown", "no evidence of BLIS (text dumps carry none)")
    if _blis_unprobed(b):
        return _f("blis.gemm", "unknown", _BLIS_UNPROBED, "install the build tools", *_compiler_commands())
    with_addon = [lib for lib in b["libraries"] if lib["has_addon"]]
    if not with_addon:
        return _f("blis.gemm", "info", "not run: no library with the add-on")
    good = [lib for lib in with_addon if lib["gemm_s8s8s32"] == "ok"]
    if good:
        return _f(
            "blis.gemm", "ok", f"3x5x7 s8s8s32 GEMM (plain and reordered B) matches the reference in {good[0]['path']}"
        )
    lib = with_addon[0]
    usable = _usable(r)
    if usable is not None and "avx512_vnni" not in usable:
        # without it the library returns without a correct result: not a broken install, the wrong CPU
        return _f(
            "blis.gemm",
            "info",
            f"{lib['path']}: GEMM {lib['gemm_s8s8s32']}: {AOCL_INT8_NEEDS}, which this CPU lacks; "
            "the amd-blis backend is not for it (ktforge's own kernels run here)",
        )
    return _f(
        "blis.gemm",
        "error",
        f"{lib['path']}: GEMM {lib['gemm_s8s8s32']} {lib['probe_detail']}".strip(),
        "this AOCL-BLAS build is unusable here; install another (e.g. the aoclda wheel)",
        _BLIS_COMMAND,
    )


# --- toolchain ----------------------------------------------------------------------------


def _cxx(r: Assessment) -> list[Compiler]:
    found = r["toolchain"]
    return [c for c in found["compilers"] if c["language"] == "c++"] if found else []


@check("toolchain.compiler", "toolchain", "C++ compiler")
def _tc_compiler(r: Assessment) -> Finding:
    if r["toolchain"] is None:
        return _f("toolchain.compiler", "unknown", "the toolchain is not in the evidence")
    cxx = _cxx(r)
    if not cxx:
        return _f(
            "toolchain.compiler",
            "error",
            "no C++ compiler (g++ or clang++) on PATH",
            "install a C++ compiler",
            "sudo apt-get install -y g++   # Debian/Ubuntu",
            "sudo dnf install -y gcc-c++   # Fedora/RHEL",
        )
    return _f("toolchain.compiler", "ok", "; ".join(f"{c['name']} {c['version']} ({c['path']})" for c in cxx))


@check("toolchain.backend_flags", "toolchain", "compiler accepts the recommended backend's flags")
def _tc_flags(r: Assessment) -> Finding:
    if r["toolchain"] is None:
        return _f("toolchain.backend_flags", "unknown", "the toolchain is not in the evidence")
    backend = r["backend"]["recommended"]
    recipe = next((x for x in r["backend"]["recipes"] if x["name"] == backend), None)
    cxx = _cxx(r)
    if recipe is None or not cxx:
        return _f("toolchain.backend_flags", "info", "no backend or no compiler to check")
    compiler = cxx[0]
    rejected = [f for f in recipe["compiler_must_accept"] if not compiler["accepts"].get(f, False)]
    also = [f for f in ("-march=sapphirerapids", "-march=znver4") if not compiler["accepts"].get(f, False)]
    note = f" (cannot target {', '.join(a.split('=')[1] for a in also)} by name)" if also else ""
    if rejected:
        return _f(
            "toolchain.backend_flags",
            "error",
            f"{compiler['name']} {compiler['version']} rejects {' '.join(rejected)} needed by {backend}",
            "install a newer compiler (gcc >= 11 or clang >= 12 for AMX)",
            "sudo apt-get install -y g++-12",
        )
    return _f(
        "toolchain.backend_flags",
        "ok",
        f"{compiler['name']} {compiler['version']} accepts {' '.join(recipe['compiler_must_accept'])}{note}",
    )


def _tool(r: Assessment, cid: str, name: Literal["cmake", "ninja"], minimum: tuple[int, ...]) -> Finding:
    if r["toolchain"] is None:
        return _f(cid, "unknown", "the toolchain is not in the evidence")
    tool = r["toolchain"][name]
    if not tool["path"]:
        return _f(cid, "warn", f"{name} is not on PATH", f"install {name}", f"python -m pip install {name}")
    version = tool["version"] or "unknown"
    parts = tuple(int(p) for p in version.split(".")[: len(minimum)] if p.isdigit())
    if parts and parts < minimum:
        return _f(
            cid,
            "warn",
            f"{name} {version} is older than {'.'.join(map(str, minimum))}",
            f"install a newer {name}",
            f"python -m pip install -U {name}",
        )
    return _f(cid, "ok", f"{name} {version} ({tool['path']})")


@check("toolchain.cmake", "toolchain", "CMake")
def _tc_cmake(r: Assessment) -> Finding:
    return _tool(r, "toolchain.cmake", "cmake", (3, 21))


@check("toolchain.ninja", "toolchain", "Ninja")
def _tc_ninja(r: Assessment) -> Finding:
    return _tool(r, "toolchain.ninja", "ninja", (1, 10))


@check("toolchain.python_headers", "toolchain", "Python headers")
def _tc_headers(r: Assessment) -> Finding:
    if r["toolchain"] is None:
        return _f("toolchain.python_headers", "unknown", "the toolchain is not in the evidence")
    headers = r["toolchain"]["python_headers"]
    if headers["present"]:
        return _f("toolchain.python_headers", "ok", f"Python.h in {headers['include_dir']}")
    return _f(
        "toolchain.python_headers",
        "error",
        f"no Python.h in {headers['include_dir']}",
        "install the Python development headers",
        "sudo apt-get install -y python3-dev   # Debian/Ubuntu",
        "sudo dnf install -y python3-devel   # Fedora/RHEL",
    )


# --- extension ----------------------------------------------------------------------------


@check("extension.installed", "extension", "native extension installed, importable, built for this CPU")
def _extension(r: Assessment) -> Finding:
    ext = r["extension"]
    if ext is None:
        return _f("extension.installed", "unknown", "the extension was not inspected (text dump)")
    status = ext.get("status")
    if status == "missing":
        return _f(
            "extension.installed",
            "warn",
            "ktforge._native is not built",
            "build the kernels for this machine",
            "./install.sh build",
        )
    if status == "broken":
        return _f(
            "extension.installed",
            "error",
            f"{ext.get('path') or 'ktforge._native'}: {ext.get('error')}",
            "rebuild the kernels for this machine",
            "./install.sh build",
        )
    if status == "stale":
        return _f("extension.installed", "error", str(ext.get("error")), "rebuild", "./install.sh build")
    if status == "refused":  # the import guard said no: ktforge.MoE() would raise this
        return _f("extension.installed", "error", str(ext.get("error")), "rebuild", "./install.sh build")
    info = ext.get("build_info") or {}
    missing = ext.get("missing_cpu_features") or []
    if missing:
        return _f(
            "extension.installed",
            "error",
            f"built with {info.get('arch_flags')} for a CPU with {', '.join(missing)}, which this CPU lacks",
            "rebuild on this machine",
            "./install.sh build",
        )
    per_backend = ext.get("backends_missing_features") or {}
    runnable = [name for name, lacking in per_backend.items() if not lacking]
    lacking = {name: miss for name, miss in per_backend.items() if miss}
    record = ext.get("record") or {}
    recipe = f"{record.get('recipe')} recipe, " if record.get("recipe") else ""
    where = f"{ext.get('path')} ({recipe}{info.get('compiler')}, {info.get('arch_flags') or 'no -march'})"
    selection = ext.get("selection")
    if record.get("recipe") == "portable" and selection is not None:
        # every level is in the wheel on purpose: the best this machine allows runs
        runs = selection["override"] or selection["auto"]
        how = f"KTFORGE_BACKEND={runs}" if selection["override"] else "the best level this CPU allows"
        better = "; ".join(f"not {name}: {why}" for name, why in selection["why_not"].items())
        return _f(
            "extension.installed",
            "ok",
            f"{where}: portable wheel, runs {runs} ({how})" + (f"; {better}" if better else ""),
        )
    if lacking:
        detail = "; ".join(f"{name} needs {', '.join(miss)}" for name, miss in lacking.items())
        return _f(
            "extension.installed",
            "warn",
            f"{where}: backends {', '.join(runnable)} run here, but {detail}: built for another CPU",
            "rebuild on this machine to use all of it",
            "./install.sh build",
        )
    best = r["backend"]["recommended"]
    if runnable and best in backends_table.names() and best not in per_backend:
        # e.g. the bootstrap install (`pip install .`, reference kernels only) is all there is
        return _f(
            "extension.installed",
            "warn",
            f"{where}: backends {', '.join(runnable)} only; built without {best}, the best this machine allows",
            "build the kernels for this machine",
            "./install.sh build",
        )
    backends = f"; backends {', '.join(runnable)}" if runnable else ""
    return _f("extension.installed", "ok", where + backends)


# --- system -------------------------------------------------------------------------------


@check("system.numa", "system", "NUMA nodes and CPUs")
def _numa(r: Assessment) -> Finding:
    numa = r["numa"]
    if numa is None:
        return _f("system.numa", "unknown", "NUMA layout is not in the evidence")
    nodes = numa["nodes"]
    if not nodes:
        return _f("system.numa", "info", "no NUMA information (sysfs node directory absent)")
    text = "; ".join(f"node {n}: {len(c)} CPUs" for n, c in sorted(nodes.items(), key=lambda x: int(x[0])))
    empty = [n for n, c in nodes.items() if not c]
    affinity, online = numa.get("affinity"), numa.get("online_cpus")
    if affinity is not None and online is not None and len(affinity) < len(online):
        text += f"; this process may use {len(affinity)} of {len(online)} online CPUs"
    if empty:
        return _f("system.numa", "info", text + f"; node(s) {', '.join(empty)} have memory but no CPUs (CXL/HBM)")
    if len(nodes) > 1:
        return _f(
            "system.numa",
            "info",
            text + ": bind one ktforge pool per node for full bandwidth",
            "",
            "numactl --hardware",
        )
    return _f("system.numa", "ok", text)


@check("system.memory", "system", "memory and huge pages")
def _memory(r: Assessment) -> Finding:
    mem = r["memory"]
    if mem is None:
        return _f("system.memory", "unknown", "memory is not in the evidence")
    total, avail = mem["total_bytes"] or 0, mem["available_bytes"] or 0
    text = (
        f"{total / GIB:.1f} GiB total, {avail / GIB:.1f} GiB available; "
        f"huge pages {mem['hugepages_total'] or 0} x {(mem['hugepage_size_bytes'] or 0) >> 20} MiB; "
        f"THP {mem['transparent_hugepages'] or 'unknown'}"
    )
    if avail < 4 * GIB:
        return _f(
            "system.memory",
            "warn",
            text + ": under 4 GiB available, too little to build and test",
            "free memory or use a larger machine",
        )
    return _f("system.memory", "ok", text)


@check("system.hypervisor", "system", "hypervisor hiding CPU features")
def _hypervisor(r: Assessment) -> Finding:
    cpu = r["cpu"]
    hv = cpu["hypervisor"]
    uarch = cpu["microarchitecture"]
    name = uarch["name"]
    used = uarch.get("hidden_used_by_kernels") or []
    unused = sorted(set(uarch.get("hidden") or []) - set(used))
    also = f"; also hidden, not used by the kernels: {', '.join(unused)}" if unused else ""
    if hv is None:
        if used:
            return _f(
                "system.hypervisor",
                "warn",
                f"a {name} has {', '.join(used)}, which this machine does not show{also}",
                "check BIOS settings and kernel boot parameters (clearcpuid)",
                "cat /proc/cmdline",
            )
        return _f("system.hypervisor", "ok", "bare metal (no hypervisor bit)" + also)
    if used:
        return _f(
            "system.hypervisor",
            "warn",
            f"{hv} guest: a {name} has {', '.join(used)}, which this guest does not see; the kernels "
            f"can only use what the guest sees{also}",
            "give the guest the host's CPU model",
            "qemu-system-x86_64 -cpu host ...   # QEMU/KVM",
            "virsh edit VM  # <cpu mode='host-passthrough'/>   # libvirt",
        )
    closest = uarch.get("closest_newer")
    note = (
        (f"; features match {closest['name']} except {', '.join(closest['missing'])} (not used by the kernels)")
        if closest
        else ""
    )
    hidden_note = f"; the {hv} CPU model hides {', '.join(unused)} (not used by the kernels)" if unused else ""
    return _f("system.hypervisor", "ok", f"{hv} guest; every kernel-relevant feature is visible{note}{hidden_note}")


@check("sources.agree", "system", "CPUID, XCR0, /proc/cpuinfo and the model number agree")
def _sources(r: Assessment) -> Finding:
    items = r["disagreements"]
    if not items:
        return _f("sources.agree", "ok", "no disagreement between the sources")
    serious = [d for d in items if d["topic"] != "cpu.model"]
    text = " | ".join(d["detail"] for d in items)
    if serious:
        return _f("sources.agree", "warn", text, "trust CPUID+XCR0 (what ktforge uses); check the kernel and VM")
    return _f("sources.agree", "info", text)


@check("probes.ran", "system", "probes compiled and ran")
def _probes(r: Assessment) -> Finding:
    probes = _probes_run(r)
    if not probes:
        return _f("probes.ran", "unknown", f"no probe ran (evidence from a {r['source']['kind']} dump)")
    bad = {k: v for k, v in probes.items() if v["status"] != "ok"}
    if _no_compiler(r):
        cpuid = r["cpu"]["cpuid_source"]
        seen = "CPUID read through py-cpuinfo" if cpuid == "py-cpuinfo" else "no CPUID read (py-cpuinfo failed)"
        return _f(
            "probes.ran",
            "warn",
            f"no C compiler yet: {seen}, features from /proc/cpuinfo; XCR0 (the OS state), the AMX permission "
            "and the BLIS check need the probes, which are compiled on the spot",
            "install the build tools (./install.sh deps does), then run `kt doctor` again",
            *_compiler_commands(),
        )
    if bad:
        return _f(
            "probes.ran",
            "warn",
            "; ".join(f"{k}: {v['status']} {v['detail']}" for k, v in bad.items()),
            "install a C compiler (probes are compiled on the spot)",
            "sudo apt-get install -y gcc",
        )
    return _f("probes.ran", "ok", ", ".join(sorted(probes)))


@check("backend.recommended", "backend", "recommended backend")
def _backend(r: Assessment) -> Finding:
    b = r["backend"]
    name = b["recommended"]
    rejected = [
        f"{x['name']}: {'; '.join(x['why_not'])}"
        for x in b["recipes"]
        if not x["eligible"] and x["priority"] > next((y["priority"] for y in b["recipes"] if y["name"] == name), -1)
    ]
    why = f" (not {' / '.join(rejected)})" if rejected else ""
    if name == "unknown":
        return _f(
            "backend.recommended",
            "unknown",
            f"cannot choose: the {r['source']['kind']} does not show {'; '.join(b['unseen'])}{why}",
            "give the whole output (lscpu with its Flags line, /proc/cpuinfo), or run `kt doctor` on the machine",
            "kt doctor",
        )
    if name == "none":
        # The lowest recipe is the lowest bar: its reasons say what is missing.
        lowest = min(b["recipes"], key=lambda x: x["priority"])
        return _f(
            "backend.recommended",
            "error",
            f"no backend can run here ({lowest['name']}: {'; '.join(lowest['why_not'])})",
            "ktforge needs Linux on an x86-64 CPU with at least AVX2 and FMA",
        )
    chosen = next(x for x in b["recipes"] if x["name"] == name)
    if b["provisional"]:
        return _f(
            "backend.recommended",
            "info",
            f"{name}, provisionally: unverified {'; '.join(chosen['unverified'])}{why}",
            "run `kt doctor` on the machine itself to verify every gate",
            "kt doctor",
        )
    return _f("backend.recommended", "ok", f"{name}: {chosen['summary']}{why}")


def run_checks(report: Assessment, only: list[str] | None = None) -> list[Finding]:
    known = {cid for cid, _, _, _ in _REGISTRY}
    unknown = [c for c in (only or []) if c not in known]
    if unknown:
        raise KeyError(f"unknown check id(s): {', '.join(unknown)} (see kt doctor --list-checks)")
    return [fn(report) for cid, _, _, fn in _REGISTRY if not only or cid in only]


def summarize(findings: list[Finding]) -> Summary:
    def count(status: FindingStatus) -> int:
        return sum(1 for f in findings if f.status == status)

    return {
        "ok": count("ok"),
        "info": count("info"),
        "warn": count("warn"),
        "error": count("error"),
        "unknown": count("unknown"),
    }


def exit_code(findings: list[Finding], strict: bool = False) -> int:
    counts = summarize(findings)
    if counts["error"] or (strict and counts["warn"]):
        return 1
    return 0
