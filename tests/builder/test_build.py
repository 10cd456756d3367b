"""`kt build`: plans and why-nots, forced-recipe refusals, real builds, the record, the import guard."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ktforge
from ktforge import formats
from ktforge.builder import executor, planner
from ktforge.builder.assessment import assess
from ktforge.builder.build_record import installed_record
from ktforge.cli import commands as cli
from ktforge.detect import blis, evidence, toolchain
from ktforge.detect.features import COMPILER_MACROS

from .. import host
from ..conftest import CPUINFO_FIXTURES
from ..fixture_expectations import EXPECTED
from ..wheels import run_in_new_venv

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def live_toolchain() -> dict[str, Any]:
    return toolchain.collect()


def fixture_report(name: str, tools: dict[str, Any]) -> dict[str, Any]:
    ev = evidence.from_file(CPUINFO_FIXTURES / name)
    ev.toolchain = tools  # the machine's CPU from the dump, this machine's compiler
    return assess(ev)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plan_for_every_fixture_machine(name: str, live_toolchain: dict[str, Any]) -> None:
    plan = planner.make_plan(fixture_report(name, live_toolchain))
    assert plan.recipe == EXPECTED[name]
    assert plan.ok is (EXPECTED[name] != "none")
    if plan.ok:
        assert plan.flags[0] == "-march=native" and plan.kernel_backends
        assert any("highest-priority" in r for r in plan.reasons)
        # every higher-priority recipe is listed with why not
        higher = {"amx": [], "amd-blis": ["amx"], "avx512": ["amx", "amd-blis"], "avx2": ["amx", "amd-blis", "avx512"]}
        assert {r["name"] for r in plan.rejected} >= set(higher[plan.recipe])
        assert all(r["why_not"] for r in plan.rejected)
    else:
        assert plan.missing and all(m["detail"] for m in plan.missing)


def test_forcing_amx_on_zen4_names_every_missing_gate(live_toolchain: dict[str, Any]) -> None:
    plan = planner.make_plan(fixture_report("linux-rocky8.5-zen4", live_toolchain), recipe="amx")
    assert not plan.ok
    gates = {m["gate"] for m in plan.missing}
    assert "cpu_features" in gates
    detail = next(m for m in plan.missing if m["gate"] == "cpu_features")
    assert "amx_tile" in detail["detail"] and detail["remedy"]


def test_amd_blis_without_a_working_addon_is_refused_before_compiling(live_toolchain: dict[str, Any]) -> None:
    report = fixture_report("linux-rocky8.5-zen4", live_toolchain)
    report["blis"] = {"selected": None, "libraries": [], "searched": [], "selected_library_dir": None}
    from ktforge.builder.assessment import recommend

    report["recipe"] = recommend(report)
    plan = planner.make_plan(report, recipe="amd-blis")
    assert not plan.ok
    [gate] = [m for m in plan.missing if m["gate"] == "blis_addon"]
    assert "--with-blis" in gate["remedy"]


def test_target_builds_use_the_targets_flags_and_check_its_features(live_toolchain: dict[str, Any]) -> None:
    report = fixture_report("linux-rhel7-haswell", live_toolchain)  # the host's CPU does not matter
    plan = planner.make_plan(report, recipe="amx", target="sapphirerapids")
    assert plan.ok and plan.flags[:2] == ["-march=sapphirerapids", "-mtune=sapphirerapids"]
    assert "-march=native" not in plan.flags
    refused = planner.make_plan(report, recipe="avx512", target="haswell")
    assert not refused.ok and "haswell lacks avx512f" in refused.missing[0]["detail"]
    unknown = planner.make_plan(report, recipe="avx2", target="pentium5")
    assert not unknown.ok and "unknown target" in unknown.missing[0]["detail"]


def test_plan_cli_json_and_exit_codes() -> None:
    result = CliRunner().invoke(cli.app, ["build", "--plan", "--json", "--source", str(ROOT)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["schema_version"] == 2
    assert {"recipe", "flags", "reasons", "rejected", "ok"} <= set(plan)
    assert plan["ok"] is True and plan["flags"][0] == "-march=native"
    doctor = json.loads(CliRunner().invoke(cli.app, ["doctor", "--json", "--check", "recipe.recommended"]).stdout)
    assert plan["recipe"] == doctor["recommended_recipe"]
    # a recipe this machine cannot run: refused, exit 1, nothing built
    impossible = next(r for r in ("amx", "amd-blis") if r != plan["recipe"])
    refused = CliRunner().invoke(cli.app, ["build", "--recipe", impossible, "--plan", "--source", str(ROOT)])
    assert refused.exit_code == 1 and "cannot build:" in refused.stdout
    # --backend, the option's old name, still names a recipe
    alias = CliRunner().invoke(cli.app, ["build", "--backend", impossible, "--plan", "--source", str(ROOT)])
    assert (alias.exit_code, alias.stdout) == (refused.exit_code, refused.stdout)


def test_build_lock_is_exclusive(tmp_path: Path) -> None:
    with (
        executor.build_lock(tmp_path),
        (tmp_path / ".kt-build.lock").open("w") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _plan_for(backend: str, **overrides: Any) -> planner.Plan:
    report = assess(evidence.collect_live())
    plan = planner.make_plan(report, recipe=backend)
    assert plan.ok, plan.missing
    for key, value in overrides.items():
        plan.cmake_defines[key] = value
    return plan


@pytest.mark.parametrize("backend", ["avx2", "avx512"])
def test_real_build_and_verification(backend: str) -> None:
    # a recipe this machine's gates allow is built and verified; one they don't is refused
    eligible = {r["name"]: r["eligible"] for r in host.live_report()["recipe"]["recipes"]}
    if not eligible[backend]:
        plan = planner.make_plan(host.live_report(), recipe=backend)
        assert not plan.ok and {m["gate"] for m in plan.missing} >= {"cpu_features"}
        assert all(m["remedy"] for m in plan.missing)
        return
    plan = _plan_for(backend)
    wheel, log = executor.build_wheel(plan, ROOT, lambda _: None)
    verified = executor.verify_wheel(wheel, log)
    assert {r["backend"] for r in verified} == set(plan.kernel_backends)
    assert {r["method"] for r in verified} == set(formats.names())
    assert all(r["ok"] for r in verified)


AMD_BLIS_IN_A_FRESH_VENV = """
import json, os, numpy as np, ktforge
assert not any(k.startswith("KTFORGE_") for k in os.environ), "the test must run without overrides"
rng = np.random.default_rng(0)
E, k, H, I, T = 4, 2, 96, 64, 40
g, u = (rng.standard_normal((E, I, H)).astype(np.float32) / 10 for _ in range(2))
d = rng.standard_normal((E, H, I)).astype(np.float32) / 10
x = rng.standard_normal((T, H)).astype(np.float32)
ids = np.stack([rng.permutation(E)[:k] for _ in range(T)])
w = rng.random((T, k)).astype(np.float32)
out = {"file": ktforge.__file__, "blis": ktforge.build_info()["blis"], "methods": {}}
for method in ("bf16", "int8"):
    try:
        moe = ktforge.MoE(E, k, H, I, method=method, backend="amd-blis")
    except ValueError as exc:
        out["methods"][method] = {"error": str(exc)}
        continue
    moe.load_weights(g, u, d)
    ref = ktforge.MoE(E, k, H, I, method=method, backend="reference")
    ref.load_weights(g, u, d)
    y, y_ref = moe.forward(x, ids, w), ref.forward(x, ids, w)
    err = float(np.abs(y - y_ref).max() / np.abs(y_ref).max())
    out["methods"][method] = {"info": moe.info, "rel_err": err}
print(json.dumps(out))
"""


def test_amd_blis_wheel_runs_amd_blis_in_a_fresh_venv_without_environment_variables(tmp_path: Path) -> None:
    # AOCL-BLAS from the aoclda wheel: has the add-on; its integer GEMM needs AVX-512 VNNI
    [aocl] = [lib for lib in (blis.summarize(c) for c in blis.discover()["candidates"]) if lib["has_addon"]]
    report = host.live_report()
    plan = planner.make_plan(report, recipe="amd-blis")
    if not plan.ok:
        # Not an AMD with AVX-512 VNNI and a working add-on: the same recipe and library over the
        # kernel backends this CPU runs (on an Intel AVX-512 host only the vendor gate differs).
        eligible = {r["name"]: r["eligible"] for r in report["recipe"]["recipes"]}
        plan = _plan_for("avx512" if eligible["avx512"] else "avx2")
        plan.cmake_defines.update(KTFORGE_BLIS_LIBRARY=aocl["path"], KTFORGE_RECIPE="amd-blis")
        plan.recipe = "amd-blis"
    wheel, log = executor.build_wheel(plan, ROOT, lambda _: None)
    if host.has("avx512_vnni"):
        verified = executor.verify_wheel(wheel, log)  # includes a GEMM through the linked library
        assert any(r["backend"] == "blis" and r["ok"] for r in verified)
    else:  # the build's own check catches what AOCL cannot do here: nothing would be installed
        with pytest.raises(planner.PlanError, match="verification failed: blis int8"):
            executor.verify_wheel(wheel, log)

    with zipfile.ZipFile(wheel) as archive:
        so = next(n for n in archive.namelist() if n.startswith("ktforge/_native"))
        record = json.loads(archive.read("ktforge/build_record.json"))
        target = tmp_path / "native.so"
        target.write_bytes(archive.read(so))
    dynamic = subprocess.run(["readelf", "-d", str(target)], capture_output=True, text=True).stdout
    assert "RPATH" in dynamic and aocl["library_dir"] in dynamic
    assert record["recipe"] == "amd-blis" and record["blis"]["library"] == aocl["path"]

    # As a user gets it: the wheel in a new virtualenv (dependencies from this Python's
    # site-packages), no KTFORGE_* variable, run from outside the checkout.
    _, result = run_in_new_venv(wheel, AMD_BLIS_IN_A_FRESH_VENV, tmp_path)
    assert result["blis"]["library"] == aocl["path"]
    bf16 = result["methods"]["bf16"]
    assert bf16["info"]["name"] == "amd-blis" and bf16["info"]["aocl"]["library"] == aocl["path"]
    assert bf16["rel_err"] < 1e-5  # AOCL's bf16 GEMM or ktforge's, both exact to the reference's order
    int8 = result["methods"]["int8"]
    if host.has("avx512_vnni"):
        assert int8["info"]["aocl"]["library"] == aocl["path"] and int8["rel_err"] < 1e-5
    else:
        assert "aocl_gemm_s8s8s32os32 gives wrong results on this CPU" in int8["error"]


def test_the_installed_build_is_kept_for_another_environment() -> None:
    # ./install.sh (kt build) keeps the wheel it installed, whatever was built since (this module
    # rebuilds the host's recipe in build/kt-*/): the same build for vLLM's virtualenv
    kept = sorted((ROOT / "build" / "installed").glob("ktforge-*.whl"))
    assert len(kept) == 1, kept
    with zipfile.ZipFile(kept[0]) as archive:
        assert json.loads(archive.read("ktforge/build_record.json")) == installed_record()


def test_failed_build_leaves_the_installed_kernels_working() -> None:
    before = installed_record()
    plan = _plan_for("avx2", KTFORGE_ARCH_FLAGS="-mno-such-isa-flag")
    plan.cmake_defines["KTFORGE_BACKENDS"] = "avx512"  # the bogus flags reach the compiler
    with pytest.raises(planner.PlanError, match="the full log is"):
        executor.build_wheel(plan, ROOT, lambda _: None)
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

    report = assess(evidence.collect_live())
    plan = planner.make_plan(report, recipe="amx", target="sapphirerapids")
    assert plan.ok, plan.missing
    assert "-march=native" not in plan.cmake_defines["KTFORGE_ARCH_FLAGS"]
    wheel, log = executor.build_wheel(plan, ROOT, lambda _: None)
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
