"""Finding BLIS libraries and asking each, through the BLIS probe, what it really offers.

"Has the aocl_gemm add-on" is decided by loading the library and looking the
LPGEMM entry points up, then running a small GEMM through them: a file name or a
header proves nothing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import site
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ktforge.detect.probe_runner import ProbeOutcome, run_probe
from ktforge.detect.report_types import BlisCandidate, BlisDiscovery, BlisLibrary

LIBRARY_PATTERNS = ("libblis-mt*.so*", "libblis*.so*")
# Why an installed add-on can still compute wrong: AOCL 5.x's integer kernels (its own message:
# "AVX512_VNNI ISA not supported by processor, cannot perform s8s8s32 gemm").
AOCL_INT8_NEEDS = "AOCL's integer aocl_gemm needs AVX-512 VNNI (AMD Zen 4 and newer)"
REQUIRED_LPGEMM = (
    "aocl_gemm_s8s8s32os32",
    "aocl_reorder_s8s8s32os32",
    "aocl_get_reorder_buf_size_s8s8s32os32",
)


def _site_dirs() -> list[str]:
    """Where this Python's packages are: its site directories, and any other on its import path
    (a .pth file's, the user site's), since a wheel's libraries (aoclda's) live beside them."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    with contextlib.suppress(AttributeError):  # some virtualenv builds lack it
        dirs.extend(site.getsitepackages())
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_absolute()]
    return list(dict.fromkeys(dirs))


def search_dirs(env: Mapping[str, str] | None = None, site_dirs: Sequence[str] | None = None) -> list[str]:
    """Directories searched for BLIS, in priority order (explicit roots first)."""
    env = os.environ if env is None else env
    dirs: list[str] = []
    for var in ("BLIS_ROOT", "AOCL_ROOT"):
        root = env.get(var)
        if root:
            dirs += [root, *(f"{root}/{sub}" for sub in ("lib", "lib64", "lib/LP64", "lib_LP64", "lib/ILP64"))]
    for root in sorted(glob.glob("/opt/AMD/aocl/*")) + sorted(glob.glob("/opt/AMD/aocl/*/*")):
        dirs += [f"{root}/lib", f"{root}/lib64", f"{root}/lib/LP64", f"{root}/lib_LP64"]
    dirs += [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/usr/local/lib", "/usr/local/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
    for sp in _site_dirs() if site_dirs is None else site_dirs:
        # auditwheel puts bundled libraries in <dist>.libs next to the package
        dirs += sorted(glob.glob(f"{sp}/*.libs")) + sorted(glob.glob(f"{sp}/*/lib"))
    return list(dict.fromkeys(dirs))


def find_candidates(dirs: Sequence[str]) -> list[str]:
    """Every BLIS shared library in ``dirs``, one path per distinct file."""
    seen: set[str] = set()
    found: list[str] = []
    for directory in dirs:
        for pattern in LIBRARY_PATTERNS:
            for path in sorted(glob.glob(f"{directory}/{pattern}")):
                real = os.path.realpath(path)
                if real in seen or not Path(real).is_file() or ".so" not in Path(path).name:
                    continue
                seen.add(real)
                found.append(path)
    return found


def header_for(library: str) -> str | None:
    """blis.h belonging to the install that holds ``library``, if any."""
    lib_dir = Path(library).resolve().parent
    roots = [lib_dir.parent, lib_dir.parent.parent]
    candidates = [r / "include" / sub / "blis.h" for r in roots for sub in ("", "blis", "LP64")]
    candidates += [Path("/usr/include/blis/blis.h"), Path("/usr/include/x86_64-linux-gnu/blis/blis.h")]
    if str(lib_dir).startswith(("/usr/lib", "/usr/local/lib")):
        return next((str(c) for c in candidates if c.is_file()), None)
    return next((str(c) for c in candidates[:-2] if c.is_file()), None)


def probe_library(path: str) -> BlisCandidate:
    """Run the BLIS probe on one library; always returns a record, never raises."""
    lib_dir = str(Path(path).resolve().parent)
    # Wheels' bundled libraries find their siblings (libomp) only through the loader path.
    env = {
        "LD_LIBRARY_PATH": ":".join(filter(None, [lib_dir, os.environ.get("LD_LIBRARY_PATH", "")])),
        "BLIS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    outcome: ProbeOutcome = run_probe("blis", [path], env=env)
    return {"path": path, "library_dir": lib_dir, "header": header_for(path), "probe": outcome.to_json()}


def discover(dirs: Sequence[str] | None = None) -> BlisDiscovery:
    """Search ``dirs`` (default: :func:`search_dirs`) and probe every library found."""
    dirs = list(search_dirs() if dirs is None else dirs)
    return {"searched": dirs, "candidates": [probe_library(p) for p in find_candidates(dirs)]}


def summarize(candidate: BlisCandidate | Mapping[str, Any]) -> BlisLibrary:
    """Flatten one candidate record into the facts the report shows."""
    probe = ProbeOutcome.from_json(candidate.get("probe", {}))
    data = probe.data or {}
    symbols = data.get("symbols") or {}
    addon = bool(symbols) and all(symbols.get(s) for s in REQUIRED_LPGEMM)
    gemm = data.get("gemm_s8s8s32", "not-run") if data.get("loaded") else "not-run"
    if probe.status == "crashed":
        gemm = "crashed"
    name = Path(str(candidate.get("path", ""))).name
    threading = data.get("threading") or "unknown"
    if threading == "unknown" and "-mt" in name:
        threading = "multithreaded"
    return {
        "path": str(candidate.get("path", "")),
        "library_dir": str(candidate.get("library_dir", "")),
        "loaded": bool(data.get("loaded")),
        "load_error": data.get("error") if not data.get("loaded") else None,
        "probe_status": probe.status,
        "probe_detail": probe.detail,
        "version": data.get("version"),
        "threading": threading,
        "header": candidate.get("header"),
        "has_addon": addon,
        "symbols": symbols,
        "gemm_s8s8s32": gemm,
        "usable": addon and gemm == "ok",
    }
