"""`kt doctor` on a fresh server, before `./install.sh deps` has installed a compiler: CPUID
through py-cpuinfo, the facts that need the probes named, the command that installs one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ktforge.builder.assessment import assess
from ktforge.detect import dumps, pycpuinfo
from ktforge.detect.evidence import Evidence

from ..conftest import CPUINFO_FIXTURES


def _doctor_without_compilers(tmp_path: Path) -> tuple[int, dict[str, Any]]:
    # PATH holds only tools a bare server has (no cc, gcc, g++, clang); a fresh probe cache
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("lscpu", "uname", "ldconfig"):
        found = shutil.which(tool) or shutil.which(tool, path="/sbin:/usr/sbin")
        if found:
            (bare / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(PATH=str(bare), KTFORGE_CACHE_DIR=str(tmp_path / "cache"))
    assert all(shutil.which(c, path=str(bare)) is None for c in ("cc", "gcc", "g++", "clang", "c++"))
    done = subprocess.run(
        [sys.executable, "-m", "ktforge", "doctor", "--json"], capture_output=True, text=True, env=env, timeout=300
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_doctor_without_a_compiler_reads_cpuid_through_py_cpuinfo(tmp_path: Path) -> None:
    code, document = _doctor_without_compilers(tmp_path)
    report = document["report"]
    checks = {c["id"]: c for c in document["checks"]}
    kernel = dumps.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    cpu = report["cpu"]
    assert cpu["cpuid_source"] == "py-cpuinfo"
    assert (cpu["vendor"], cpu["family"], cpu["model"]) == (kernel.vendor, kernel.family, kernel.model)
    assert report["probes"]["cpu"]["status"] == "no-compiler"
    # what needs the probes is named, with the command that installs a compiler
    ran = checks["probes.ran"]
    assert ran["status"] == "warn"
    assert all(fact in ran["finding"] for fact in ("py-cpuinfo", "XCR0", "AMX permission", "BLIS"))
    assert "./install.sh deps" in ran["commands"]
    assert checks["os.xcr0"]["status"] == "unknown"
    assert {checks[c]["status"] for c in ("blis.found", "blis.addon", "blis.gemm")} == {"unknown"}
    amx_status = checks["amx.permission"]["status"]
    assert amx_status == ("unknown" if "amx_tile" in (kernel.flags or ()) else "info")
    assert checks["toolchain.compiler"]["status"] == "error" and code == 1
    # still a recommendation: from the kernel's flags, provisional until the probes run
    assert document["recommended_recipe"] != "none"
    assert report["recipe"]["provisional"] is True


def test_py_cpuinfo_agrees_with_the_probe_here() -> None:
    from .. import host

    live = host.live_report()
    seen = pycpuinfo.collect()
    assert seen["status"] == "ok", seen
    assert seen["vendor"] == live["cpu"]["vendor"] and seen["family"] == live["cpu"]["family"]
    assert not [d for d in live["disagreements"] if "py-cpuinfo" in d["detail"]]


def test_a_py_cpuinfo_disagreement_is_reported() -> None:
    text = (CPUINFO_FIXTURES / "linux-rocky8.5-zen4").read_text()
    kernel_flags = dumps.parse_cpuinfo(text).flags or frozenset()
    # py-cpuinfo seeing no AVX-512 where the kernel lists it: a hypervisor or kernel quirk to report
    pyc = {"status": "ok", "vendor": "AuthenticAMD", "brand": "x", "family": 25, "model": 17, "stepping": 1}
    pyc["flags"] = sorted(f for f in kernel_flags if not f.startswith("avx512"))
    report = assess(Evidence(source="live", cpuinfo_text=text, pycpuinfo=pyc))
    topics = {d["topic"] for d in report["disagreements"]}
    assert {"feature.avx512f", "feature.avx512bw", "feature.avx512_vnni"} <= topics
    assert "feature.avx512_bf16" not in topics  # py-cpuinfo cannot see leaf 7.1: no false alarm
