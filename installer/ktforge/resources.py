"""Where ktforge finds its shipped data (probe sources, recipes, tables) and its cache."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
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


def private_cache_dir(*parts: str) -> Path | None:
    """``cache_dir()/parts``, created private (0700), or None when it cannot be: unwritable (a
    read-only HOME), or another user can write it or a parent of it. What is read from a
    cache (compiled probes above all, which are executed) is trusted only there."""
    try:
        root = cache_dir()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # ours private too, not only the leaf
        path = root.joinpath(*parts)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError, KeyError):  # RuntimeError, KeyError: no HOME and no passwd entry
        return None
    return path if owned_private_dir(path) else None


def owned_private_dir(path: Path) -> bool:
    """``path`` is a real directory of this user that no other user can write, nor replace
    through a parent (one writable by others without the sticky bit, as /tmp has)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return False
    for parent in path.resolve().parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return False
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return False
    return True


def file_is_ours(path: Path) -> bool:
    """A cached file that may be used (run, for a binary): a regular file of this user,
    writable by no other."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def umask() -> int:
    """The process's file-creation mask, read without changing it (``os.umask`` sets a new one
    to return the old, and another thread creating a file meanwhile would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # no /proc (Linux < 4.7): the racy way
    os.umask(old)
    return old


def shared_file_mode() -> int:
    """The mode of an output file others may read, as the user's umask allows (0644 under 022,
    0600 under 077): what ``open()`` gives a new file, for files made private first (mkstemp)."""
    return 0o666 & ~umask()


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replaces ``path`` atomically (fsynced) through a new file of unique name (``mkstemp``:
    created with O_EXCL and mode 0600, so a planted file or symlink is never followed)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def parse_toml(data: bytes) -> dict[str, Any]:
    """A TOML document from bytes; ValueError where they are not UTF-8 TOML."""
    document: dict[str, Any] = tomllib.loads(data.decode())  # both errors are ValueErrors
    return document


def load_toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        document: dict[str, Any] = tomllib.load(handle)
    return document
