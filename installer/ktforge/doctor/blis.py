"""Checks of BLIS: a library, its aocl_gemm add-on, and whether its GEMM runs correctly here."""

from __future__ import annotations

from ktforge.builder.assessment import Assessment
from ktforge.detect.blis import AOCL_INT8_NEEDS
from ktforge.detect.report_types import BlisSection
from ktforge.doctor import common
from ktforge.doctor.findings import Finding, FindingStatus, Say, check
from ktforge.remedies import remedy

# --- blis ---------------------------------------------------------------------------------

_BLIS = remedy("blis_addon")
_TOOLS = remedy("build_tools")
_BLIS_UNPROBED = "not checked: the BLIS probe (which loads each library and runs a GEMM) needs a C compiler"


def _blis_unprobed(b: BlisSection) -> bool:
    return any(lib["probe_status"] == "no-compiler" for lib in b["libraries"])


def _unseen(b: BlisSection | None, say: Say) -> Finding:
    """Every BLIS check when the evidence has no BLIS section, or its probe could not run."""
    if b is None:
        return say("unknown", "no evidence of BLIS (text dumps carry none)")
    return say("unknown", _BLIS_UNPROBED, _TOOLS.text, *common.compiler_commands())


@check("blis.found", "blis", "BLIS library")
def _blis_found(r: Assessment, say: Say) -> Finding:
    b = r["blis"]
    if b is None or _blis_unprobed(b):
        return _unseen(b, say)
    libs = b["libraries"]
    if not libs:
        status: FindingStatus = "warn" if common.amd(r) else "info"
        return say(
            status,
            f"no BLIS library in {len(b['searched'])} searched directories"
            + (": the amd-blis backend is unavailable" if common.amd(r) else ""),
            _BLIS.text + " (or set BLIS_ROOT)",
            *_BLIS.commands,
        )
    described = "; ".join(f"{lib['path']} ({lib['version'] or 'version unknown'}, {lib['threading']})" for lib in libs)
    broken = [lib for lib in libs if not lib["loaded"]]
    if len(broken) == len(libs):
        return say(
            "warn",
            f"found but none loads: {broken[0]['load_error']}",
            "reinstall the library or fix its dependencies",
            f"ldd {broken[0]['path']}",
        )
    return say("ok", described)


@check("blis.addon", "blis", "aocl_gemm (LPGEMM) add-on")
def _blis_addon(r: Assessment, say: Say) -> Finding:
    b = r["blis"]
    if b is None or _blis_unprobed(b):
        return _unseen(b, say)
    with_addon = [lib for lib in b["libraries"] if lib["has_addon"]]
    if with_addon:
        lib = with_addon[0]
        extra = [s for s in ("aocl_gemm_bf16bf16f32of32", "aocl_gemm_bf16s4f32of32") if lib["symbols"].get(s)]
        return say(
            "ok",
            f"{lib['path']} exports aocl_gemm_s8s8s32os32 and its reorder API"
            + (f"; also {', '.join(extra)}" if extra else "")
            + ("" if lib["header"] else "; no blis.h (ktforge declares the API itself)"),
        )
    status: FindingStatus = "warn" if common.amd(r) else "info"
    if b["libraries"]:
        names = ", ".join(lib["path"] for lib in b["libraries"])
        return say(
            status,
            f"{names}: upstream BLIS without the aocl_gemm add-on (Debian's libblis is built this way)",
            _BLIS.text,
            *_BLIS.commands,
        )
    return say(status, "no BLIS library, so no add-on", _BLIS.text, *_BLIS.commands)


@check("blis.gemm", "blis", "aocl_gemm s8s8s32 GEMM runs and is correct")
def _blis_gemm(r: Assessment, say: Say) -> Finding:
    b = r["blis"]
    if b is None or _blis_unprobed(b):
        return _unseen(b, say)
    with_addon = [lib for lib in b["libraries"] if lib["has_addon"]]
    if not with_addon:
        return say("info", "not run: no library with the add-on")
    good = [lib for lib in with_addon if lib["gemm_s8s8s32"] == "ok"]
    if good:
        return say("ok", f"3x5x7 s8s8s32 GEMM (plain and reordered B) matches the reference in {good[0]['path']}")
    lib = with_addon[0]
    usable = common.usable(r)
    if usable is not None and "avx512_vnni" not in usable:
        # without it the library returns without a correct result: not a broken install, the wrong CPU
        lacks = "which cpu.mask hides" if lib["gemm_s8s8s32"].startswith("hidden") else "which this CPU lacks"
        return say(
            "info",
            f"{lib['path']}: GEMM {lib['gemm_s8s8s32']}: {AOCL_INT8_NEEDS}, {lacks}; "
            "the amd-blis backend is not for it (ktforge's own kernels run here)",
        )
    return say(
        "error",
        f"{lib['path']}: GEMM {lib['gemm_s8s8s32']} {lib['probe_detail']}".strip(),
        "this AOCL-BLAS build is unusable here; " + _BLIS.text,
        *_BLIS.commands,
    )
