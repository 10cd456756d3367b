"""A missing, empty, invalid or inconsistent build record refuses the import with the fix, and
`kt doctor` runs the same check: doctor "ok" exactly when `ktforge.MoE()` works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import ktforge

INSTALLED = Path(ktforge.__file__).parent


def _copy_package(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    shutil.copytree(INSTALLED, root / "ktforge", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KTFORGE_BACKEND"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120, cwd=root)


def _use_kernels(root: Path) -> subprocess.CompletedProcess[str]:
    script = (
        "import sys, ktforge\n"
        "try:\n    print(ktforge.MoE(2, 1, 32, 32).info['name'])\n"
        "except RuntimeError as exc:\n    print('refused:', exc, file=sys.stderr); sys.exit(1)\n"
    )
    return _run(root, "-c", script)


def _doctor(root: Path) -> dict[str, object]:
    done = _run(root, "-m", "ktforge", "doctor", "--json", "--check", "extension.installed")
    [finding] = json.loads(done.stdout)["checks"]
    assert isinstance(finding, dict)
    return finding


def _edit(field: str, value: object) -> Callable[[dict[str, object]], None]:
    def edit(record: dict[str, object]) -> None:
        record[field] = value

    return edit


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing": (lambda p: p.unlink(), "is missing"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "not json": (lambda p: p.write_text("{ this is not json"), "unreadable"),
    "a list": (lambda p: p.write_text("[]"), "not a JSON object"),
}
EDITS: dict[str, tuple[Callable[[dict[str, object]], None], str]] = {
    "format": (_edit("record_version", 99), "has format 99"),
    "no backends": (_edit("backends", "avx2"), "no well-formed backend list"),
    "unknown primary": (_edit("primary_backend", "avx1024"), "names backend 'avx1024'"),
    "other build": (
        lambda r: r.update(backends=[*r["backends"], {"name": "avx1024", "required_cpu_features": []}]),  # type: ignore[list-item]
        "from different builds",
    ),
    "other version": (_edit("ktforge_version", "0.0.1"), "is for ktforge 0.0.1"),
}


@pytest.mark.parametrize("case", sorted(CASES) + sorted(EDITS))
def test_a_bad_record_refuses_the_import_and_the_doctor_says_so(case: str, tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    path = root / "ktforge" / "build_record.json"
    if case in CASES:
        change, why = CASES[case]
        change(path)
    else:
        edit, why = EDITS[case]
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))
    used = _use_kernels(root)
    assert used.returncode == 1
    assert used.stderr.startswith("refused:") and why in used.stderr and "kt build" in used.stderr, used.stderr
    finding = _doctor(root)
    assert finding["status"] == "error" and why in str(finding["finding"]), finding
    assert "./install.sh build" in finding["commands"]  # type: ignore[operator]


def test_the_intact_copy_works_and_the_doctor_says_ok(tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    used = _use_kernels(root)
    assert used.returncode == 0, used.stderr
    assert _doctor(root)["status"] in ("ok", "warn")
