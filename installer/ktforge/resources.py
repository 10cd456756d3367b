"""Where ktforge finds its shipped data (probe sources, recipes, tables) and its cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ktforge

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def data_path(*parts: str) -> Path:
    """Path of a shipped data file, e.g. ``data_path("probes", "cpu.c")``.

    The package may span several directories (an editable install keeps the Python
    sources in the checkout and the CMake-installed files in site-packages), so
    every location of the package is searched.
    """
    locations = list(ktforge.__spec__.submodule_search_locations or []) if ktforge.__spec__ else []
    locations.append(str(Path(ktforge.__file__).parent))
    for location in locations:
        candidate = Path(location, "data", *parts)
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"ktforge data file {'/'.join(parts)} is missing from this installation "
        f"(searched {', '.join(locations)}); reinstall with ./install.sh"
    )


def cache_dir() -> Path:
    """Per-user cache (compiled probes, tool answers): $KTFORGE_CACHE_DIR or XDG's."""
    explicit = os.environ.get("KTFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ktforge"


def load_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        document: dict[str, Any] = tomllib.load(handle)
    return document
