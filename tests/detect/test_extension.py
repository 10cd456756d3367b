"""The native extension, and the doctor when it is missing, broken or built for another CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import ktforge
from ktforge.detect import extension

from .. import host


def test_extension_is_built_and_reports_what_it_requires(host_flags: set[str]) -> None:
    # Fails (rather than skips) when the extension was not built: the build is part of the product.
    import ktforge._native as native

    info = native.build_info()
    assert info["version"] == ktforge.__version__
    assert info["arch_flags"]
    # the module itself (runtime, dispatcher, reference kernels) needs no ISA extension
    assert info["required_cpu_features"] == []
    backends = {b["name"]: b for b in info["backends"]}
    assert backends["reference"]["required_cpu_features"] == []
    assert {"avx2", "fma"} <= set(backends["avx2"]["required_cpu_features"])
    assert not set(backends["avx2"]["required_cpu_features"]) & {"avx512f", "amx_tile"}  # a true AVX2 build
    # the tile model is an AVX2 build too: it runs wherever avx2 does
    assert backends["amx-model"]["required_cpu_features"] == backends["avx2"]["required_cpu_features"]
    if "avx512" in backends:
        assert {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(backends["avx512"]["required_cpu_features"])
    # ./install.sh built the recipe the live report recommends: every backend it lists is in
    assert host.recipe_backends() <= set(backends)
    for backend in backends.values():
        # built here, for here
        assert set(backend["required_cpu_features"]) <= host_flags
        assert backend["runs_here"] is True


def test_inspect_reports_ok_for_the_installed_extension() -> None:
    result = extension.inspect()
    assert result["status"] == "ok", result
    assert result["build_info"]["version"] == ktforge.__version__


def _fake_package(tmp_path: Path, body: str | bytes, suffix: str) -> dict[str, str]:
    pkg = tmp_path / "fakekt"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    target = pkg / f"_native{suffix}"
    if isinstance(body, bytes):
        target.write_bytes(body)
    else:
        target.write_text(body)
    return {"PYTHONPATH": str(tmp_path)}


def _inspect_with(env: dict[str, str], module: str) -> dict[str, object]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    try:
        return extension.inspect(module)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old


def test_inspect_survives_a_corrupt_binary(tmp_path: Path) -> None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    env = _fake_package(tmp_path, b"\x7fELF garbage, not a shared object", suffix)
    result = _inspect_with(env, "fakekt._native")
    assert result["status"] == "broken"
    assert "ImportError" in str(result["error"])


def test_inspect_survives_sigill_at_import(tmp_path: Path) -> None:
    env = _fake_package(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n", ".py")
    result = _inspect_with(env, "fakekt._native")
    assert result["status"] == "broken"
    assert "SIGILL" in str(result["error"]) and "instructions this CPU lacks" in str(result["error"])


def test_inspect_reports_missing(tmp_path: Path) -> None:
    (tmp_path / "fakekt").mkdir()
    (tmp_path / "fakekt" / "__init__.py").write_text("")
    assert _inspect_with({"PYTHONPATH": str(tmp_path)}, "fakekt._native")["status"] == "missing"


@pytest.fixture()
def broken_install(tmp_path: Path) -> dict[str, str]:
    """A copy of the installed ktforge whose extension binary is truncated garbage."""
    installed = Path(ktforge.__file__).parent
    native = next(
        p
        for loc in (ktforge.__spec__.submodule_search_locations or [])
        if ktforge.__spec__
        for p in Path(loc).glob("_native*.so")
    )
    copy = tmp_path / "site" / "ktforge"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for loc in ktforge.__spec__.submodule_search_locations or [] if ktforge.__spec__ else []:
        if Path(loc, "data").is_dir():
            shutil.copytree(Path(loc, "data"), copy / "data", dirs_exist_ok=True)
    (copy / native.name).write_bytes(native.read_bytes()[:4096])
    site_packages = [p for p in sys.path if p.endswith("site-packages")]
    # -S: no site hooks, so an editable install's finder cannot pull in the real package
    return {
        "PYTHONPATH": os.pathsep.join([str(copy.parent), *site_packages]),
        "PATH": os.environ["PATH"],
        "KTFORGE_CACHE_DIR": os.environ["KTFORGE_CACHE_DIR"],
    }


def test_doctor_with_a_broken_extension_reports_it_and_exits_1(broken_install: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-S", "-m", "ktforge", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=broken_install,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["report"]["extension"]["status"] == "broken"
    finding = next(c for c in document["checks"] if c["id"] == "extension.installed")
    assert finding["status"] == "error"
    assert "./install.sh build" in finding["commands"]
    # every other check still ran
    assert {c["id"] for c in document["checks"]} >= {"cpu.avx512", "amx.permission", "blis.addon"}


def test_the_build_is_instrumented_exactly_in_the_sanitizer_run() -> None:
    # scripts/sanitize.sh sets KTFORGE_EXPECT_SANITIZED: its run must be on an ASan/UBSan build,
    # and no other build may carry the instrumentation
    so = next(Path(ktforge.__file__).parent.glob("_native*.so")).read_bytes()
    instrumented = b"__asan_init" in so and b"__ubsan_handle" in so
    assert instrumented is bool(os.environ.get("KTFORGE_EXPECT_SANITIZED"))
