"""`kt build --portable`: one wheel with every x86-64 level, the best chosen at run time.

The selection is replayed on every recorded machine (the same rule as the kernels' registry,
on the features the report decodes); the portable wheel is built once, its object code
disassembled level by level, its tag checked, and it is installed into a new virtualenv and
run there the way a user gets it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

import ktforge
from ktforge.builder import backends, executor, planner
from ktforge.builder.assessment import assess
from ktforge.builder.build_record import compiled_features
from ktforge.detect import blis, evidence

from .. import host
from ..conftest import CPUINFO_FIXTURES, HOST_FIXTURES
from ..wheels import run_in_new_venv, user_environment

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("g++") or "g++"

# The level a portable wheel runs on each recorded x86-64 machine (text dumps carry no AMX
# permission answer: it is taken as granted where the CPU and OS have the tiles).
PORTABLE_EXPECTED = {
    "linux-rhel7-ivybridge": "reference",  # no AVX2: only the reference kernels run
    "linux-rhel6-piledriver": "reference",
    "linux-scientific7-k10": "reference",
    "linux-scientificfermi6-bulldozer": "reference",
    "linux-rhel7-broadwell": "avx2",
    "linux-rhel7-haswell": "avx2",
    "linux-rhel7-x86_64_v3": "avx2",
    "linux-rhel7-zen": "avx2",
    "linux-ubuntu20.04-zen3": "avx2",
    "linux-ubuntu24.04-alderlake": "avx2",
    "linux-ubuntu26.04-arrowlake_s": "avx2",
    "windows-cpuid-broadwell": "avx2",
    "linux-rhel7-skylake_avx512": "avx512",  # Skylake-SP: F/BW/VL/DQ, no VNNI
    "linux-centos7-cascadelake": "avx512-vnni",
    "windows-cpuid-icelake": "avx512-vnni",  # VNNI without BF16
    "linux-rocky8.5-zen4": "avx512-bf16",
    "linux-rocky9-zen5": "avx512-bf16",
    "linux-unknown-sapphirerapids": "amx",
}


@pytest.fixture(scope="module")
def levels() -> list[tuple[str, list[str]]]:
    """Every level of a portable wheel with the CPU features its flags require (the compiler's
    own macros, as the build record states them), best first."""
    return [
        (name, compiled_features(CXX, list(backends.by_name(name).flags))) for name in planner.portable_backends()
    ] + [(backends.ALWAYS, [])]


@pytest.mark.parametrize("machine", sorted(PORTABLE_EXPECTED))
def test_each_recorded_machine_gets_its_level(machine: str, levels: list[tuple[str, list[str]]]) -> None:
    report = assess(evidence.from_file(CPUINFO_FIXTURES / machine))
    usable = set(report["cpu"]["usable_features"] or ())
    choice = backends.select(levels, usable.__contains__, lambda: report["amx"]["permitted"] is not False)
    assert choice.name == PORTABLE_EXPECTED[machine]
    better = [name for name, _ in levels[: [n for n, _ in levels].index(choice.name)]]
    assert list(choice.why_not) == better  # and every better level says why not


def test_a_refused_amx_permission_falls_to_the_next_level(levels: list[tuple[str, list[str]]]) -> None:
    report = assess(evidence.from_file(HOST_FIXTURES / "kvm-sapphirerapids-masked.snapshot.json"))
    usable = set(report["cpu"]["usable_features"] or ())
    assert backends.select(levels, usable.__contains__, lambda: True).name == "amx"
    refused = backends.select(levels, usable.__contains__, lambda: False)
    assert refused.name == "avx512-bf16" and "permission" in refused.why_not["amx"]


def test_the_extension_chooses_what_the_rule_says() -> None:
    # the installed build: the registry's choice (C++) and the replayed rule (Python) agree
    import numpy as np

    selection = ktforge.build_info()["selection"]
    moe = ktforge.MoE(4, 2, 64, 64, backend="auto")
    moe.load_weights(*(np.ones(s, np.float32) for s in ((4, 64, 64),) * 3))
    assert moe.info["name"] == selection["auto"]
    assert selection["auto"] == host.expected_auto_backend()


# --- the wheel itself ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The portable wheel (tagged), and its CMake build directory."""
    plan = planner.make_portable_plan(host.live_report())
    assert plan.ok, planner.format_plan(plan)
    wheel, log = executor.build_wheel(plan, ROOT, lambda _: None)
    executor.verify_wheel(wheel, log)  # the levels this CPU runs, against the reference
    tagged = executor.repair_wheel(wheel, tmp_path_factory.mktemp("dist"), log)
    return tagged, wheel.parent.parent / "cmake"


# What each level's object code may not hold: instructions its flags do not enable.
FORBIDDEN = {
    "-mavx512f": re.compile(r"%zmm|%k[1-7]\b"),
    "-mavx512vnni": re.compile(r"\bvpdp(bu|ws)sds?\b"),
    "-mavx512bf16": re.compile(r"\bvdpbf16ps\b|\bvcvtne2?ps2bf16\b"),
    "-mamx-tile": re.compile(r"\bldtilecfg\b|\btileloadd|\btilestored\b|\btilezero\b|\btdpb"),
}
ANY_SIMD = re.compile(r"%[yz]mm|\bldtilecfg\b|\btdpb")  # the core's code: x86-64 baseline only


def _disassembly(obj: Path) -> dict[str, str]:
    """Function name -> its instructions."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)], capture_output=True, text=True)
    functions: dict[str, str] = {}
    name = ""
    for line in text.stdout.splitlines():
        if re.match(r"^[0-9a-f]+ <.*>:$", line):
            name = line.split(" <", 1)[1][:-2]
            functions[name] = ""
        elif name:
            functions[name] += line + "\n"
    return functions


def test_each_level_holds_nothing_above_its_level(portable: tuple[Path, Path]) -> None:
    _, cmake = portable
    for name in planner.portable_backends():
        row = backends.by_name(name)
        [obj] = (cmake / "native" / "CMakeFiles" / f"ktforge_{row.name}.dir").rglob("kernels.cpp.o")
        code = "".join(_disassembly(obj).values())
        assert code, obj
        for flag, pattern in FORBIDDEN.items():
            found = pattern.search(code)
            assert flag in row.flags or found is None, f"{name} holds {found and found.group()} without {flag}"
        # and each does use its own level's top instruction
        own = {"avx2": "%ymm", "avx512": "%zmm", "avx512-vnni": "vpdpbusd", "avx512-bf16": "vdpbf16ps", "amx": "tdpb"}
        assert own[name] in code, f"{name} does not use {own[name]}"
    core = cmake / "native" / "CMakeFiles"
    objects = [*(core / "ktforge_core.dir").rglob("*.o"), *(core / "_native.dir").rglob("*.o")]
    assert len(objects) >= 8
    for obj in objects:
        for function, code in _disassembly(obj).items():
            if "[clone .arch_x86_64_v" in function:  # pack.cpp's own clones, dispatched at run time
                continue
            assert not ANY_SIMD.search(code), f"{obj.name}: {function} uses SIMD above the baseline"


def test_the_wheel_is_tagged_and_holds_every_level(portable: tuple[Path, Path]) -> None:
    wheel, _ = portable
    assert re.fullmatch(r"ktforge-.+-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        record = json.loads(archive.read("ktforge/build_record.json"))
    assert record["recipe"] == "portable" and record["arch_flags"] == "" and record["primary_backend"] is None
    assert record["host_fingerprint"] is None and record["blis"] is None
    assert [b["name"] for b in record["backends"]] == [*planner.portable_backends(), "reference"]
    for b in record["backends"]:
        assert not any("native" in flag for flag in b["flags"]), b  # no -march/-mtune=native anywhere


PORTABLE_IN_A_VENV = """
import json, os, numpy as np, ktforge
assert not any(k.startswith("KTFORGE_") for k in os.environ), "the test must run without overrides"
from ktforge.builder import verify
info = ktforge.build_info()
moe = ktforge.MoE(4, 2, 64, 64)
moe.load_weights(*(np.ones(s, np.float32) for s in ((4, 64, 64),) * 3))
blis = ktforge.MoE(4, 2, 64, 64, method="bf16", backend="amd-blis")  # AOCL found at run time, not linked
blis.load_weights(*(np.ones(s, np.float32) for s in ((4, 64, 64),) * 3))
print(json.dumps({"file": ktforge.__file__, "selection": info["selection"], "runs": moe.info["name"],
                  "verified": verify.results(), "aocl": blis.info.get("aocl"), "linked": info["blis"]}))
"""


def test_the_wheel_installs_and_runs_in_a_new_virtualenv(portable: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, _ = portable
    venv, result = run_in_new_venv(wheel, PORTABLE_IN_A_VENV, tmp_path)
    assert result["runs"] == result["selection"]["auto"] == host.expected_auto_backend(portable=True)
    assert result["verified"] and all(r["ok"] for r in result["verified"])
    # nothing linked; the aoclda wheel's AOCL-BLAS (a test requirement) found and checked at run time
    [aocl] = [lib for lib in (blis.summarize(c) for c in blis.discover()["candidates"]) if lib["has_addon"]]
    assert result["linked"] is None and result["aocl"]["library"] == aocl["path"]
    doctor = subprocess.run(
        [str(venv / "bin" / "kt"), "doctor", "--json", "--check", "extension.installed"],
        capture_output=True,
        text=True,
        env=user_environment(),
        cwd=tmp_path,
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    [finding] = json.loads(doctor.stdout)["checks"]
    assert finding["status"] == "ok" and f"portable wheel, runs {result['runs']}" in finding["finding"]
