"""What ktforge starts: nothing from the working directory or from a cache another user can
write; every command's time limit ends its whole process group; a total time budget; tool
output of any bytes. (ktforge.process, ktforge.resources, the probe runner and toolchain cache.)"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ktforge import process, resources
from ktforge.detect import probe_runner, toolchain

KT = str(Path(sys.executable).parent / "kt")  # the console script, as users run it

# Modules the doctor's children import (json, the CPUID decoder, numpy, ktforge itself): each
# planted in the working directory creates PWNED when imported.
PLANTED = ("json.py", "numpy.py", "cpuinfo.py", "ml_dtypes.py", "typer.py", "ktforge/__init__.py", "sitecustomize.py")


def _plant(directory: Path) -> Path:
    marker = directory / "PWNED"
    for name in PLANTED:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    return marker


@pytest.mark.parametrize("args", [["doctor", "--json"], ["build", "--plan", "--json"]], ids=["doctor", "build-plan"])
def test_no_code_from_the_working_directory_runs(args: list[str], tmp_path: Path) -> None:
    # A freshly cloned model repository with Python files at its top, and a PATH with "." in it.
    marker = _plant(tmp_path)
    env = dict(os.environ, PATH=f".:{os.environ['PATH']}:")
    (tmp_path / "lscpu").write_text(f"#!/bin/sh\necho lscpu >> {marker}\n")
    (tmp_path / "lscpu").chmod(0o755)
    if args[0] == "build":
        args = [*args, "--source", str(Path(__file__).parents[1])]
    done = subprocess.run([KT, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert not marker.exists(), f"ran from the working directory: {marker.read_text()}"
    assert done.returncode in (0, 1), done.stderr
    json.loads(done.stdout)  # the whole report, not a give-up


def test_install_sh_imports_nothing_from_the_directory_it_is_called_from(tmp_path: Path) -> None:
    # ./install.sh's checks run `python -c` (the working directory first on sys.path)
    marker = _plant(tmp_path)
    for name in ("sysconfig.py", "ensurepip.py"):
        (tmp_path / name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    install_sh = Path(__file__).parents[1] / "install.sh"
    done = subprocess.run(
        ["bash", str(install_sh), "deps", "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), f"ran from the working directory: {marker.read_text()}"


def test_a_child_python_sees_this_process_path_but_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _plant(tmp_path)
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    (elsewhere / "kt_probe_module.py").write_text("import json, ktforge\nprint(json.dumps([42, ktforge.__file__]))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{elsewhere}:.:")
    done = process.run(process.python_command("kt_probe_module"), timeout=60)
    assert done.returncode == 0, done.stderr
    value, where = json.loads(done.stdout)
    assert value == 42 and not where.startswith(str(tmp_path))
    assert not marker.exists()


def test_a_timeout_ends_the_whole_process_group(tmp_path: Path) -> None:
    # A shell whose grandchild holds the pipes: killing only the shell would leave the read
    # waiting for the grandchild (the doctor behind a `cc` wrapper script).
    pid_file = tmp_path / "grandchild"
    script = tmp_path / "slow-tool"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pid_file}\necho started\nwait\n")
    script.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        process.run([str(script)], timeout=1.0)
    assert time.monotonic() - start < 10
    assert "started" in str(caught.value.output)
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not Path(f"/proc/{grandchild}").exists() or "Z" in _state(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild outlived the timeout")
    # the same program is not waited for again in this process
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as again:
        process.run([str(script)], timeout=60)
    assert time.monotonic() - start < 1 and "did not answer earlier" in str(again.value.output)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def test_the_time_budget_caps_all_waits_together(tmp_path: Path) -> None:
    tools = []
    for name in ("a", "b", "c"):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\nexec sleep 600\n")
        tool.chmod(0o755)
        tools.append(tool)
    start = time.monotonic()
    with process.time_budget(2.0):
        for tool in tools:
            with pytest.raises(subprocess.TimeoutExpired):
                process.run([str(tool)], timeout=30)
    assert time.monotonic() - start < 8


def test_output_of_any_bytes_is_text(tmp_path: Path) -> None:
    tool = tmp_path / "latin1"
    tool.write_bytes(b"#!/bin/sh\nprintf 'Mod\\350le: \\377\\n'\n")
    tool.chmod(0o755)
    assert process.run([str(tool)], timeout=10).stdout == "Mod\ufffdle: \ufffd\n"


def test_which_ignores_relative_and_world_writable_path_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cc").write_text("#!/bin/sh\n")
    (tmp_path / "cc").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", ".::bin")
    assert process.which("cc") is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert process.which("cc") == str(tmp_path / "cc")
    tmp_path.chmod(0o1777)  # anyone may plant a cc here (the sticky bit only guards deletion)
    assert process.which("cc") is None


# ---- caches ---------------------------------------------------------------------------------


def _user_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """A user's setting: HOME, no KTFORGE_CACHE_DIR or XDG_CACHE_HOME; returns the cache ktforge
    then uses (~/.cache/ktforge)."""
    monkeypatch.delenv("KTFORGE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    return home / ".cache" / "ktforge"


def test_the_default_cache_is_private_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cache = _user_home(monkeypatch, home)
    binary, _ = probe_runner.compile_probe("cpu")
    assert binary is not None and binary.parent == cache / "probes"
    assert stat.S_IMODE(cache.stat().st_mode) == stat.S_IMODE((cache / "probes").stat().st_mode) == 0o700
    mtime = binary.stat().st_mtime_ns
    assert probe_runner.run_probe("cpu").ok
    assert binary.stat().st_mtime_ns == mtime  # taken from the cache, not compiled again


@pytest.mark.parametrize("how", ["HOME", "KTFORGE_CACHE_DIR"])
def test_a_probe_cached_where_others_can_write_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    shared = tmp_path / "shared"  # a directory every user can write (a shared scratch space)
    shared.mkdir()
    shared.chmod(0o777)
    if how == "HOME":
        cache = _user_home(monkeypatch, shared)
    else:
        cache = shared / "ktforge"
        monkeypatch.setenv("KTFORGE_CACHE_DIR", str(cache))
    assert resources.private_cache_dir("probes") is None  # 0777 without the sticky bit above it
    marker = tmp_path / "PWNED"
    # what an attacker leaves where the probe binary would be cached
    binary, _ = probe_runner.compile_probe("cpu")
    assert binary is not None and not binary.is_relative_to(cache)
    planted = cache / "probes" / binary.name
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    planted.chmod(0o777)
    outcome = probe_runner.run_probe("cpu")
    assert outcome.ok and outcome.data and outcome.data.get("leaves")
    assert not marker.exists()


def test_a_replaced_binary_in_the_private_cache_is_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home").mkdir()
    cache = _user_home(monkeypatch, tmp_path / "home")
    binary, _ = probe_runner.compile_probe("cpu")
    assert binary is not None and binary.parent == cache / "probes"
    marker = tmp_path / "PWNED"
    binary.unlink()
    binary.write_text(f"#!/bin/sh\ntouch {marker}\n")
    binary.chmod(0o777)  # writable by others: not trusted, compiled again
    assert probe_runner.run_probe("cpu").ok
    assert not marker.exists()
    assert stat.S_IMODE(binary.stat().st_mode) == 0o700


def test_an_unwritable_cache_costs_time_not_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: a HOME that is a regular file cannot hold a cache
        home = tmp_path / "file"
        home.write_text("")
    _user_home(monkeypatch, home)
    assert resources.private_cache_dir("probes") is None
    assert probe_runner.run_probe("cpu").ok
    assert toolchain.collect()["compilers"]


def test_the_toolchain_cache_never_follows_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home").mkdir()
    _user_home(monkeypatch, tmp_path / "home")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    cache = resources.private_cache_dir()
    assert cache is not None
    for pid in range(os.getpid() - 5, os.getpid() + 50):  # every name the old code could have used
        (cache / f"toolchain.{pid}.tmp").symlink_to(victim)
    (cache / toolchain.CACHE_NAME).symlink_to(victim)
    toolchain.collect()
    assert victim.read_text() == "keep me"
    assert not (cache / toolchain.CACHE_NAME).is_symlink()  # replaced by a file of its own
    json.loads((cache / toolchain.CACHE_NAME).read_text())


def test_a_hung_compiler_costs_one_timeout_not_one_per_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `cc` first on PATH never answers, through a shell whose child holds the pipes.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("cc", "gcc", "g++", "clang", "clang++"):
        (bin_dir / name).write_text("#!/bin/sh\nsleep 600\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    (tmp_path / "home").mkdir()
    _user_home(monkeypatch, tmp_path / "home")
    monkeypatch.setattr(probe_runner, "COMPILE_TIMEOUT_S", 2.0)
    monkeypatch.setattr(process, "_hung", set())
    from ktforge.detect import evidence

    monkeypatch.setattr(evidence, "LIVE_BUDGET_S", 6.0)
    start = time.monotonic()
    seen = evidence.collect_live()
    assert time.monotonic() - start < 30
    assert seen.cpu_probe is not None and seen.cpu_probe["status"] == "compile-failed"
    assert seen.amx_probe is not None and seen.amx_probe["status"] == "compile-failed"
    assert shutil.which("cc") == str(bin_dir / "cc")


def _kt_json(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, object]:
    done = subprocess.run([KT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    document = json.loads(done.stdout)
    assert isinstance(document, dict)
    return document


def test_a_read_only_home_costs_the_doctor_nothing(tmp_path: Path) -> None:
    # a container's read-only HOME: no cache can be written (for root too: HOME is a file here)
    home = tmp_path / "home"
    home.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("KTFORGE_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    report = _kt_json(["doctor", "--json"], env, tmp_path)["report"]
    assert isinstance(report, dict) and report["probes"]["cpu"]["status"] == "ok"  # compiled in a private temp dir
    plan = _kt_json(["build", "--plan", "--json", "--source", str(Path(__file__).parents[1])], env, tmp_path)
    assert plan


def test_tools_printing_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real_gcc, real_lscpu = shutil.which("gcc"), shutil.which("lscpu")
    assert real_gcc and real_lscpu
    # a localized lscpu (Latin-1 "Modèle") and a gcc whose banner has a stray byte
    (bin_dir / "lscpu").write_bytes(
        b'#!/bin/sh\n"' + real_lscpu.encode() + b'" "$@" | sed "s/Model name/Mod\\xe8le name/"\nprintf "\\377\\n"\n'
    )
    (bin_dir / "gcc").write_bytes(
        b'#!/bin/sh\nif [ "$1" = --version ]; then printf "gcc (Debian \\377) 12.2.0\\n"; exit 0; fi\nexec "'
        + real_gcc.encode()
        + b'" "$@"\n'
    )
    for tool in ("lscpu", "gcc"):
        (bin_dir / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    document = _kt_json(["doctor", "--json"], env, tmp_path)
    assert document["checks"]
