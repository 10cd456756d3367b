"""The BLIS probe on the three real cases here: AOCL with the add-on (the aoclda wheel),
upstream BLIS without it (Debian's libblis-dev), and none; plus libraries that are not BLIS."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

from ktforge.builder.assessment import assess
from ktforge.detect import blis
from ktforge.detect.evidence import Evidence
from ktforge.doctor import run_checks

from .. import host

DEBIAN_BLIS = Path("/usr/lib/x86_64-linux-gnu/libblis.so.4")


def _aoclda_libs() -> Path:
    spec = importlib.util.find_spec("aoclda")
    assert spec is not None and spec.origin, "the aoclda wheel is required: python -m pip install aoclda"
    libs = Path(spec.origin).parent.parent / "aoclda.libs"
    assert libs.is_dir(), f"{libs} missing: reinstall aoclda"
    return libs


def _summaries(dirs: list[str]) -> list[dict[str, Any]]:
    return [blis.summarize(c) for c in blis.discover(dirs)["candidates"]]


def test_aocl_from_the_aoclda_wheel_has_a_working_addon() -> None:
    [lib] = _summaries([str(_aoclda_libs())])
    assert lib["loaded"], lib["load_error"]
    assert lib["version"].startswith("AOCL-BLAS")
    assert lib["threading"] == "openmp"
    assert lib["has_addon"]
    # AOCL's integer aocl_gemm computes on AVX-512 VNNI CPUs (Zen 4+, Ice Lake+); elsewhere
    # (Zen 3, here or on other hosts) the probe must catch the wrong result, not trust the symbol
    if host.has("avx512_vnni"):
        assert lib["gemm_s8s8s32"] == "ok" and lib["usable"]
    else:
        assert lib["gemm_s8s8s32"] != "ok" and not lib["usable"]
    assert lib["symbols"]["aocl_gemm_bf16bf16f32of32"] is True
    assert lib["header"] is None  # wheels ship no headers


def test_debian_libblis_is_upstream_blis_without_the_addon() -> None:
    assert DEBIAN_BLIS.exists(), "Debian's libblis-dev is required: apt-get install libblis-dev"
    [lib] = _summaries([str(DEBIAN_BLIS.parent)])
    assert lib["loaded"] and lib["version"] == "0.9.0"
    assert lib["has_addon"] is False and not any(lib["symbols"].values())
    assert lib["gemm_s8s8s32"] == "not-run" and not lib["usable"]


def test_no_blis_anywhere(tmp_path: Path) -> None:
    found = blis.discover([str(tmp_path)])
    assert found == {"searched": [str(tmp_path)], "candidates": []}


def test_a_library_that_is_not_blis(tmp_path: Path) -> None:
    libm = next(p for p in (Path("/lib/x86_64-linux-gnu/libm.so.6"), Path("/usr/lib64/libm.so.6")) if p.exists())
    shutil.copy(libm, tmp_path / "libblis.so")
    [lib] = _summaries([str(tmp_path)])
    assert lib["loaded"] and lib["version"] is None and not lib["has_addon"]


def test_a_corrupt_library_is_reported_not_crashed_on(tmp_path: Path) -> None:
    (tmp_path / "libblis.so.4").write_bytes(b"\x7fELF this is not a library")
    [lib] = _summaries([str(tmp_path)])
    assert lib["loaded"] is False and lib["probe_status"] == "ok"
    assert lib["load_error"]


def test_search_honours_blis_root_and_wheel_libs(tmp_path: Path) -> None:
    dirs = blis.search_dirs({"BLIS_ROOT": str(tmp_path), "LD_LIBRARY_PATH": "/x:/y"}, site_dirs=["/sp"])
    assert dirs[0] == str(tmp_path) and f"{tmp_path}/lib" in dirs
    assert "/x" in dirs and "/y" in dirs


def _report_with(libs_dirs: list[str], vendor_leaf0: list[int]) -> dict[str, Any]:
    ev = Evidence(source="live", blis=blis.discover(libs_dirs), cpuid_rows=[vendor_leaf0])
    return assess(ev)


AMD_LEAF0 = [0, 0, 0x10, 0x68747541, 0x444D4163, 0x69746E65]  # "AuthenticAMD"


@pytest.mark.parametrize("case", ["aocl", "debian", "none"])
def test_doctor_blis_checks_on_the_three_real_cases(case: str, tmp_path: Path) -> None:
    dirs = {"aocl": [str(_aoclda_libs())], "debian": [str(DEBIAN_BLIS.parent)], "none": [str(tmp_path)]}[case]
    report = _report_with(dirs, AMD_LEAF0)
    findings = {f.id: f for f in run_checks(report, ["blis.found", "blis.addon", "blis.gemm"])}
    if case == "aocl" and host.has("avx512_vnni"):
        assert [findings[i].status for i in ("blis.found", "blis.addon", "blis.gemm")] == ["ok", "ok", "ok"]
        assert report["blis"]["selected"] is not None
    elif case == "aocl":  # the library is fine; this CPU is not one AOCL's integer GEMM runs on
        assert [findings[i].status for i in ("blis.found", "blis.addon", "blis.gemm")] == ["ok", "ok", "info"]
        assert "needs AVX-512 VNNI" in findings["blis.gemm"].finding
        assert report["blis"]["selected"] is None
    elif case == "debian":
        assert findings["blis.found"].status == "ok"
        assert findings["blis.addon"].status == "warn"  # on AMD the amd-blis backend is lost
        assert "without the aocl_gemm add-on" in findings["blis.addon"].finding
        assert "pip install aoclda" in " ".join(findings["blis.addon"].commands)
    else:
        assert findings["blis.found"].status == "warn"
        assert report["blis"]["selected"] is None
