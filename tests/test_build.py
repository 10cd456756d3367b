"""`kt build`: plans and why-nots, forced-recipe refusals, real builds, the record, the import guard."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ktforge
from ktforge import blis, build, cli, evidence, toolchain
from ktforge.build_record import installed_record
from ktforge.features import COMPILER_MACROS
from ktforge.report import build_report

from .conftest import CPUINFO_FIXTURES
from .test_fixture_machines import EXPECTED

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def live_toolchain() -> dict[str, Any]:
    return toolchain.collect()


def fixture_report(name: str, tools: dict[str, Any]) -> dict[str, Any]:
    ev = evidence.from_file(CPUINFO_FIXTURES / name)
    ev.toolchain = tools  # the machine's CPU from the dump, this machine's compiler
    return build_report(ev)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plan_for_every_fixture_machine(name: str, live_toolchain: dict[str, Any]) -> None:
    plan = build.make_plan(fixture_report(name, live_toolchain))
    assert plan.backend == EXPECTED[name]
    assert plan.ok is (EXPECTED[name] != "none")
    if plan.ok:
        assert plan.flags[0] == "-march=native" and plan.kernel_backends
        assert any("highest-priority" in r for r in plan.reasons)
        # every higher-priority recipe is listed with why not
        higher = {"amx": [], "amd-blis": ["amx"], "avx512": ["amx", "amd-blis"], "avx2": ["amx", "amd-blis", "avx512"]}
        assert {r["name"] for r in plan.rejected} >= set(higher[plan.backend])
        assert all(r["why_not"] for r in plan.rejected)
    else:
        assert plan.missing and all(m["detail"] for m in plan.missing)


def test_forcing_amx_on_zen4_names_every_missing_gate(live_toolchain: dict[str, Any]) -> None:
    plan = build.make_plan(fixture_report("linux-rocky8.5-zen4", live_toolchain), backend="amx")
    assert not plan.ok
    gates = {m["gate"] for m in plan.missing}
    assert "cpu_features" in gates
    detail = next(m for m in plan.missing if m["gate"] == "cpu_features")
    assert "amx_tile" in detail["detail"] and detail["remedy"]


def test_amd_blis_without_a_working_addon_is_refused_before_compiling(live_toolchain: dict[str, Any]) -> None:
    report = fixture_report("linux-rocky8.5-zen4", live_toolchain)
    report["blis"] = {"selected": None, "libraries": [], "searched": [], "selected_library_dir": None}
    from ktforge import recipes
    from ktforge.report import recipe_facts

    report["backend"] = recipes.choose(recipe_facts(report))
    plan = build.make_plan(report, backend="amd-blis")
    assert not plan.ok
    [gate] = [m for m in plan.missing if m["gate"] == "blis_addon"]
    assert "--with-blis" in gate["remedy"]


def test_target_builds_use_the_targets_flags_and_check_its_features(live_toolchain: dict[str, Any]) -> None:
    report = fixture_report("linux-rhel7-haswell", live_toolchain)  # the host's CPU does not matter
    plan = build.make_plan(report, backend="amx", target="sapphirerapids")
    assert plan.ok and plan.flags[:2] == ["-march=sapphirerapids", "-mtune=sapphirerapids"]
    assert "-march=native" not in plan.flags
    refused = build.make_plan(report, backend="avx512", target="haswell")
    assert not refused.ok and "haswell lacks avx512f" in refused.missing[0]["detail"]
    unknown = build.make_plan(report, backend="avx2", target="pentium5")
    assert not unknown.ok and "unknown target" in unknown.missing[0]["detail"]


def test_plan_cli_json_and_exit_codes() -> None:
    result = CliRunner().invoke(cli.app, ["build", "--plan", "--json", "--source", str(ROOT)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["schema_version"] == 1
    assert {"backend", "flags", "reasons", "rejected", "ok"} <= set(plan)
    assert plan["ok"] is True and plan["flags"][0] == "-march=native"
    doctor = json.loads(CliRunner().invoke(cli.app, ["doctor", "--json", "--check", "backend.recommended"]).stdout)
    assert plan["backend"] == doctor["recommended_backend"]
    # a recipe this machine cannot run: refused, exit 1, nothing built
    impossible = next(r for r in ("amx", "amd-blis") if r != plan["backend"])
    refused = CliRunner().invoke(cli.app, ["build", "--backend", impossible, "--plan", "--source", str(ROOT)])
    assert refused.exit_code == 1 and "cannot build:" in refused.stdout


def test_build_lock_is_exclusive(tmp_path: Path) -> None:
    with (
        build.build_lock(tmp_path),
        (tmp_path / ".kt-build.lock").open("w") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _plan_for(backend: str, **overrides: Any) -> build.Plan:
    report = build_report(evidence.collect_live())
    plan = build.make_plan(report, backend=backend)
    assert plan.ok, plan.missing
    for key, value in overrides.items():
        plan.cmake_defines[key] = value
    return plan


@pytest.mark.parametrize("backend", ["avx2", "avx512"])
def test_real_build_and_verification(backend: str) -> None:
    plan = _plan_for(backend)
    wheel, log = build.build_wheel(plan, ROOT, lambda _: None)
    verified = build.verify_wheel(wheel, log)
    assert {r["backend"] for r in verified} == {b.replace("_", "-") for b in plan.kernel_backends}
    assert {r["method"] for r in verified} == {"bf16", "int8", "int4"}
    assert all(r["ok"] for r in verified)


def test_amd_blis_build_links_aocl_with_an_rpath() -> None:
    [aocl] = [lib for lib in (blis.summarize(c) for c in blis.discover()["candidates"]) if lib["usable"]]
    plan = _plan_for("avx512", KTFORGE_BLIS_LIBRARY=aocl["path"], KTFORGE_RECIPE="amd-blis")
    plan.backend = "amd-blis"
    wheel, log = build.build_wheel(plan, ROOT, lambda _: None)
    verified = build.verify_wheel(wheel, log)  # includes a GEMM through the linked library
    assert any(r["backend"] == "blis" and r["ok"] for r in verified)
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        so = next(n for n in archive.namelist() if n.startswith("ktforge/_native"))
        record = json.loads(archive.read("ktforge/build_record.json"))
        target = Path(log.parent / "native.so")
        target.write_bytes(archive.read(so))
    dynamic = subprocess.run(["readelf", "-d", str(target)], capture_output=True, text=True).stdout
    assert "RPATH" in dynamic and aocl["library_dir"] in dynamic
    assert record["recipe"] == "amd-blis" and record["blis"]["library"] == aocl["path"]


def test_failed_build_leaves_the_installed_kernels_working() -> None:
    before = installed_record()
    plan = _plan_for("avx2", KTFORGE_ARCH_FLAGS="-mno-such-isa-flag")
    plan.cmake_defines["KTFORGE_BACKENDS"] = "avx512"  # the bogus flags reach the compiler
    with pytest.raises(build.PlanError, match="the full log is"):
        build.build_wheel(plan, ROOT, lambda _: None)
    assert installed_record() == before
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ktforge, numpy as np; m = ktforge.MoE(2, 1, 32, 32); "
            "m.load_weights(*(np.ones(s, np.float32) for s in ((2,32,32),)*3)); print('ok')",
        ],
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_import_guard_refuses_a_build_for_a_richer_cpu(tmp_path: Path) -> None:
    import ktforge._native as native

    lacking = next((f for f in COMPILER_MACROS.values() if not native.cpu_has(f)), None)
    assert lacking, "this CPU has every feature ktforge knows; the guard needs one it lacks"
    installed = Path(ktforge.__file__).parent
    copy = tmp_path / "site" / "ktforge"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for location in ktforge.__spec__.submodule_search_locations or [] if ktforge.__spec__ else []:
        for item in Path(location).iterdir():
            if not (copy / item.name).exists() and item.name != "__pycache__":
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, copy / item.name)
    record = json.loads((copy / "build_record.json").read_text())
    record["primary_backend"] = record["backends"][0]["name"]
    record["backends"][0]["required_cpu_features"].append(lacking)
    (copy / "build_record.json").write_text(json.dumps(record))
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": os.pathsep.join([str(copy.parent), *site]), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import ktforge; ktforge.MoE"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 1 and done.returncode != -4  # an exception, not SIGILL
    assert "RuntimeError" in done.stderr and lacking in done.stderr and "./install.sh build" in done.stderr
    # a lower compiled backend can still be chosen explicitly
    lower = record["backends"][-1]["name"]
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import ktforge; print(ktforge.MoE(2, 1, 32, 32).info['name'])"],
        capture_output=True,
        text=True,
        env=env | {"KTFORGE_BACKEND": lower},
    )
    assert done.stdout.strip() == lower, done.stderr


def test_target_build_for_sapphirerapids_compiles_tile_instructions() -> None:
    import zipfile

    report = build_report(evidence.collect_live())
    plan = build.make_plan(report, backend="amx", target="sapphirerapids")
    assert plan.ok, plan.missing
    assert "-march=native" not in plan.cmake_defines["KTFORGE_ARCH_FLAGS"]
    wheel, log = build.build_wheel(plan, ROOT, lambda _: None)
    with zipfile.ZipFile(wheel) as archive:
        so = next(n for n in archive.namelist() if n.startswith("ktforge/_native"))
        record = json.loads(archive.read("ktforge/build_record.json"))
        target = log.parent / "target_native.so"
        target.write_bytes(archive.read(so))
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(target)], capture_output=True, text=True
    ).stdout
    assert "tdpbf16ps" in disassembly and "tdpbusd" in disassembly and "ldtilecfg" in disassembly
    assert record["target"] == "sapphirerapids" and record["primary_backend"] == "amx"
    amx = next(b for b in record["backends"] if b["name"] == "amx")
    assert {"amx_tile", "amx_int8", "amx_bf16"} <= set(amx["required_cpu_features"])
    assert record["host_fingerprint"] is None  # built for another machine
