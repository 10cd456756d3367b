"""Checks of the toolchain and of the installed native extension."""

from __future__ import annotations

from typing import Literal

from ktforge import formats
from ktforge.builder import backends as backends_table
from ktforge.builder.assessment import Assessment
from ktforge.detect.report_types import Compiler
from ktforge.doctor.findings import Finding, Say, check

# --- toolchain ----------------------------------------------------------------------------


def _cxx(r: Assessment) -> list[Compiler]:
    found = r["toolchain"]
    return [c for c in found["compilers"] if c["language"] == "c++"] if found else []


@check("toolchain.compiler", "toolchain", "C++ compiler")
def _tc_compiler(r: Assessment, say: Say) -> Finding:
    if r["toolchain"] is None:
        return say("unknown", "the toolchain is not in the evidence")
    cxx = _cxx(r)
    if not cxx:
        return say(
            "error",
            "no C++ compiler (g++ or clang++) on PATH",
            "install a C++ compiler",
            "sudo apt-get install -y g++   # Debian/Ubuntu",
            "sudo dnf install -y gcc-c++   # Fedora/RHEL",
        )
    return say("ok", "; ".join(f"{c['name']} {c['version']} ({c['path']})" for c in cxx))


@check("toolchain.recipe_flags", "toolchain", "compiler accepts the recommended recipe's flags")
def _tc_flags(r: Assessment, say: Say) -> Finding:
    if r["toolchain"] is None:
        return say("unknown", "the toolchain is not in the evidence")
    backend = r["recipe"]["recommended"]
    recipe = next((x for x in r["recipe"]["recipes"] if x["name"] == backend), None)
    cxx = _cxx(r)
    if recipe is None or not cxx:
        return say("info", "no backend or no compiler to check")
    compiler = cxx[0]
    rejected = [f for f in recipe["compiler_must_accept"] if not compiler["accepts"].get(f, False)]
    # the newest target of this host's vendor, by name (another vendor's is no concern here)
    named = {"GenuineIntel": "-march=sapphirerapids", "AuthenticAMD": "-march=znver4"}.get(r["cpu"]["vendor"] or "")
    also = [named] if named and not compiler["accepts"].get(named, False) else []
    note = f" (cannot target {', '.join(a.split('=')[1] for a in also)} by name)" if also else ""
    if rejected:
        return say(
            "error",
            f"{compiler['name']} {compiler['version']} rejects {' '.join(rejected)} needed by {backend}",
            "install a newer compiler (gcc >= 11 or clang >= 12 for AMX)",
            "sudo apt-get install -y g++-12",
        )
    return say(
        "ok",
        f"{compiler['name']} {compiler['version']} accepts {' '.join(recipe['compiler_must_accept'])}{note}",
    )


def _tool(r: Assessment, say: Say, name: Literal["cmake", "ninja"], minimum: tuple[int, ...]) -> Finding:
    if r["toolchain"] is None:
        return say("unknown", "the toolchain is not in the evidence")
    tool = r["toolchain"][name]
    if not tool["path"]:
        return say("warn", f"{name} is not on PATH", f"install {name}", f"python -m pip install {name}")
    version = tool["version"] or "unknown"
    parts = tuple(int(p) for p in version.split(".")[: len(minimum)] if p.isdigit())
    if parts and parts < minimum:
        return say(
            "warn",
            f"{name} {version} is older than {'.'.join(map(str, minimum))}",
            f"install a newer {name}",
            f"python -m pip install -U {name}",
        )
    return say("ok", f"{name} {version} ({tool['path']})")


@check("toolchain.cmake", "toolchain", "CMake")
def _tc_cmake(r: Assessment, say: Say) -> Finding:
    return _tool(r, say, "cmake", (3, 21))


@check("toolchain.ninja", "toolchain", "Ninja")
def _tc_ninja(r: Assessment, say: Say) -> Finding:
    return _tool(r, say, "ninja", (1, 10))


@check("toolchain.python_headers", "toolchain", "Python headers")
def _tc_headers(r: Assessment, say: Say) -> Finding:
    if r["toolchain"] is None:
        return say("unknown", "the toolchain is not in the evidence")
    headers = r["toolchain"]["python_headers"]
    if headers["present"]:
        return say("ok", f"Python.h in {headers['include_dir']}")
    return say(
        "error",
        f"no Python.h in {headers['include_dir']}",
        "install the Python development headers",
        "sudo apt-get install -y python3-dev   # Debian/Ubuntu",
        "sudo dnf install -y python3-devel   # Fedora/RHEL",
    )


# --- extension ----------------------------------------------------------------------------


@check("extension.installed", "extension", "native extension installed, importable, built for this CPU")
def _extension(r: Assessment, say: Say) -> Finding:
    ext = r["extension"]
    if ext is None:
        return say("unknown", "the extension was not inspected (text dump)")
    status = ext.get("status")
    if status == "missing":
        return say(
            "warn",
            "ktforge._native is not built",
            "build the kernels for this machine",
            "./install.sh build",
        )
    if status == "broken":
        return say(
            "error",
            f"{ext.get('path') or 'ktforge._native'}: {ext.get('error')}",
            "rebuild the kernels for this machine",
            "./install.sh build",
        )
    if status == "stale":
        return say("error", str(ext.get("error")), "rebuild", "./install.sh build")
    if status == "refused":  # the import guard said no: ktforge.MoE() would raise this
        return say("error", str(ext.get("error")), "rebuild", "./install.sh build")
    info = ext.get("build_info") or {}
    missing = ext.get("missing_cpu_features") or []
    if missing:
        return say(
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
        return say(
            "ok",
            f"{where}: portable wheel, runs {runs} ({how})" + (f"; {better}" if better else ""),
        )
    hidden = set(r["cpu"]["disabled_features"])
    if lacking and all(set(miss) <= hidden for miss in lacking.values()):  # the CPU has them: a mask hides them
        detail = "; ".join(f"{name} needs {', '.join(miss)}" for name, miss in lacking.items())
        return say("info", f"{where}: backends {', '.join(runnable)} run here; {detail}, hidden by cpu.mask")
    if lacking:
        detail = "; ".join(f"{name} needs {', '.join(miss)}" for name, miss in lacking.items())
        return say(
            "warn",
            f"{where}: backends {', '.join(runnable)} run here, but {detail}: built for another CPU",
            "rebuild on this machine to use all of it",
            "./install.sh build",
        )
    best = r["recipe"]["recommended"]
    if runnable and best in backends_table.names() and best not in per_backend:
        # e.g. the bootstrap install (`pip install .`, reference kernels only) is all there is
        return say(
            "warn",
            f"{where}: backends {', '.join(runnable)} only; built without {best}, the best this machine allows",
            "build the kernels for this machine",
            "./install.sh build",
        )
    backends = f"; backends {', '.join(runnable)}" if runnable else ""
    return say("ok", where + backends)


@check("extension.kernels", "extension", "the kernel each weight format runs on the backend that runs")
def _kernels(r: Assessment, say: Say) -> Finding:
    ext = r["extension"]
    selection = ext.get("selection") if ext is not None and ext.get("status") == "ok" else None
    if ext is None or selection is None:
        return say("unknown", "the extension was not imported (see extension.installed)")
    runs = selection["override"] or selection["auto"]
    backends = (ext.get("build_info") or {}).get("backends") or []
    backend = next((b for b in backends if b.get("name") == runs), None)
    if backend is None:
        return say("unknown", f"the selected backend {runs!r} is not in the build's table")
    kernels = backend.get("kernels") or {}
    # in the format table's order (a replayed snapshot's keys come back sorted)
    listed = [name for name in formats.names() if name in kernels] + sorted(set(kernels) - set(formats.names()))
    return say("info", f"{runs}: " + "; ".join(f"{name}: {kernels[name]}" for name in listed))
