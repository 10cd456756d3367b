"""Running a built wheel the way a user gets it: installed into a new virtualenv (its
dependencies from this Python's site-packages), no KTFORGE_* variable, outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_in_new_venv(wheel: Path, script: str, where: Path) -> tuple[Path, dict[str, Any]]:
    """(the venv, the JSON the script printed on its last line)."""
    venv = where / "venv"
    # Not --system-site-packages: inside a virtualenv (./install.sh's .venv on Debian's Python)
    # that would see the base interpreter's packages, not this environment's. This
    # environment's site directories are appended instead, after the new venv's own.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    Path(own, "_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed"]
    subprocess.run([*pip, str(wheel)], check=True)
    done = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, env=user_environment(), cwd=where, timeout=600
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(venv))
    return venv, result


def user_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KTFORGE_")}
