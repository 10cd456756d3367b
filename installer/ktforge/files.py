"""Files named by other files: a manifest's layers, an index's shards, a config.

A name read from a file is a plain relative path that resolves to a regular file inside its
directory (a Hugging Face hub snapshot's links into the repository's ``blobs/`` included);
anything else is refused before it is opened for reading, so a manifest cannot make ktforge
read ``/etc/passwd``, block on a FIFO or read a device without end. JSON documents are read
with a size limit, nesting beyond the parser's limit is an error of the file, and errors never
quote the bytes of a file that did not turn out to be of the expected format.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

MAX_JSON_BYTES = 256 << 20  # a 1,000-shard index or a manifest of every layer is a few MB


class UnsafePath(ValueError):
    """A name read from a file that leads outside its directory or to no regular file."""


def _in_hub_blobs(directory: Path, target: Path) -> bool:
    """``directory`` is a hub snapshot (``<repo>/snapshots/<revision>``) and ``target`` one of
    the repository's blobs (``<repo>/blobs/<hash>``): how ``huggingface_hub`` lays files out."""
    real = directory.resolve()
    return real.parent.name == "snapshots" and target.is_relative_to(real.parent.parent / "blobs")


def leaves_directory(name: str) -> bool:
    """A name that, read as a path, points outside the directory it is relative to."""
    parts = PurePosixPath(name)
    return parts.is_absolute() or ".." in parts.parts or name.startswith("~")


def shown(value: object, limit: int = 200) -> str:
    """``value`` as a message quotes input: repr's escapes for control characters and quotes, at
    most ``limit`` characters of it, and how much more there was."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def canonical(name: str) -> bool:
    """A relative name written the one way a path is: no empty, "." or trailing component
    ("a//b", "./a", "a/" are refused), so that one file has one name in an index."""
    return name not in ("", ".") and name == str(PurePosixPath(name))


def member(directory: Path, name: object, what: str) -> Path:
    """``directory / name`` for a ``name`` read from a file: a relative path without ``..``,
    resolving to a regular file inside ``directory`` (or the hub's blobs of a snapshot)."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise UnsafePath(f"{what}: {shown(name)} is not a file name")
    if leaves_directory(name):
        raise UnsafePath(f"{what}: {shown(name)} names a file outside {directory}")
    if not canonical(name):
        raise UnsafePath(
            f"{what}: {shown(name)} is not a canonical file name (as {shown(str(PurePosixPath(name)))} would be)"
        )
    path = directory / name
    try:
        target = path.resolve(strict=True)
        info = target.stat()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop
        reason = error.strerror if isinstance(error, OSError) else "a symbolic link loop"
        raise UnsafePath(f"{path}: {reason or 'cannot be found'}") from error
    if not (target.is_relative_to(directory.resolve()) or _in_hub_blobs(directory, target)):
        raise UnsafePath(f"{what}: {shown(name)} is a link to a file outside {directory}")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{path}: not a regular file")
    return path


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; a FIFO, device or directory is
    refused without waiting on it or reading from it. Raises OSError or UnsafePath."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{path}: not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def parse_json(data: bytes, where: str) -> Any:
    """The JSON document in ``data`` (UTF-8). Raises ValueError naming ``where`` and the
    reason (nesting deeper than the parser's recursion limit included), never the bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not UTF-8 text (byte {error.start}); not JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON (line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise ValueError(f"{where} is JSON nested too deeply; not a document ktforge reads") from None


def read_json(path: Path, what: str = "") -> Any:
    """The JSON document in regular file ``path`` (at most MAX_JSON_BYTES). Raises ValueError
    (UnsafePath for special files) or OSError."""
    with open_regular(path) as handle:
        data = handle.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB; not {what or 'a JSON document'}")
    return parse_json(data, str(path))
