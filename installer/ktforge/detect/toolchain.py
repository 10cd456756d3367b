"""Compilers and build tools: what is installed and what each compiler really accepts.

Flag support is established by compiling an empty translation unit with the flag
(a compile probe), not by a version table. Answers are cached per compiler binary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ktforge import process
from ktforge.detect.report_types import Compiler, Tool, Toolchain
from ktforge.process import which
from ktforge.resources import file_is_ours, private_cache_dir, write_atomic

# Flags the recipes rely on; doctor reports each compiler's answer for all of them.
PROBED_FLAGS = (
    "-march=native",
    "-mavx512f",
    "-mavx512bf16",
    "-mavx512vnni",
    "-mamx-tile",
    "-mamx-int8",
    "-mamx-bf16",
    "-march=sapphirerapids",
    "-march=znver4",
)
COMPILER_NAMES = ("g++", "clang++", "gcc", "clang")
CACHE_NAME = "toolchain.json"


def _run(command: list[str], timeout: float = 15.0, stdin: str | None = None) -> tuple[int, str]:
    try:
        done = process.run(command, timeout=timeout, input=stdin)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def _identity(path: str) -> str:
    real = Path(path).resolve()
    stat = real.stat()
    return f"{real}:{stat.st_size}:{int(stat.st_mtime)}"


def _version(path: str) -> tuple[str, str]:
    """(family, version) of a compiler binary."""
    _, text = _run([path, "--version"])
    first = text.splitlines()[0] if text else ""
    family = "clang" if "clang" in first.lower() else "gcc" if re.search(r"gcc|g\+\+|GCC", first) else "unknown"
    if family == "gcc":
        code, full = _run([path, "-dumpfullversion"])
        if code == 0 and full:
            return family, full.splitlines()[0]
    match = re.search(r"(\d+\.\d+(\.\d+)?)", first)
    return family, match.group(1) if match else "unknown"


def accepts(path: str, flags: Sequence[str]) -> bool:
    """The compile probe: does the compiler at ``path`` build an empty unit with ``flags``?"""
    is_cxx = path.endswith("++")
    code, _ = _run(
        [path, "-x", "c++" if is_cxx else "c", *flags, "-Werror", "-c", "-", "-o", os.devnull],
        stdin="int ktforge_probe(void) { return 0; }\n",
    )
    return code == 0


def _load_cache() -> dict[str, Any]:
    """The cached answers, from a private cache only (a planted file could claim flags work)."""
    directory = private_cache_dir()
    path = directory / CACHE_NAME if directory else None
    if path is None or not file_is_ours(path):
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(data: dict[str, Any]) -> None:
    directory = private_cache_dir()
    if directory is None:
        return  # no private cache (read-only HOME, shared directory): answers are found again next time
    with contextlib.suppress(OSError):  # a full disk only costs time
        write_atomic(directory / CACHE_NAME, json.dumps(data, indent=1, sort_keys=True).encode())


def describe_compiler(path: str, cache: dict[str, Any]) -> Compiler:
    key = _identity(path)
    cached = cache.get(key)
    if isinstance(cached, dict):
        return cast(Compiler, {**cached, "path": path})
    family, version = _version(path)
    info: Compiler = {
        "name": Path(path).name,
        "path": path,
        "family": family,
        "version": version,
        "language": "c++" if path.endswith("++") else "c",
        "accepts": {flag: accepts(path, [flag]) for flag in PROBED_FLAGS},
    }
    cache[key] = info
    return info


def _tool_version(name: str, cache: dict[str, Any]) -> Tool:
    path = which(name)
    if path is None:
        return {"name": name, "path": None, "version": None}
    key = f"tool:{_identity(path)}"
    cached = cache.get(key)
    if isinstance(cached, dict):
        return cast(Tool, cached)
    _, text = _run([path, "--version"])
    match = re.search(r"(\d+\.\d+(\.\d+)?)", text)
    info: Tool = {"name": name, "path": path, "version": match.group(1) if match else None}
    cache[key] = info
    return info


def collect() -> Toolchain:
    cache = _load_cache()
    before = json.dumps(cache, sort_keys=True)
    paths: list[str] = []
    for var in ("CXX", "CC"):
        if os.environ.get(var):
            found = which(os.environ[var].split()[0])
            if found:
                paths.append(found)
    paths += [p for p in (which(n) for n in COMPILER_NAMES) if p]
    compilers = [describe_compiler(p, cache) for p in dict.fromkeys(paths)]
    include = sysconfig.get_paths().get("include", "")
    result: Toolchain = {
        "compilers": compilers,
        "cmake": _tool_version("cmake", cache),
        "ninja": _tool_version("ninja", cache),
        "python_headers": {
            "include_dir": include,
            "present": bool(include) and Path(include, "Python.h").is_file(),
        },
    }
    if json.dumps(cache, sort_keys=True) != before:
        _save_cache(cache)
    return result
