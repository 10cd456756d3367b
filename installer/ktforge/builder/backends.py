"""The kernel backends, read from one table (``data/backends.json``).

CMake, the C++ registry, ``ktforge.MoE``'s backend names and the recipes all come from it:

    python -m ktforge.builder.backends cmake OUTPUT             CMake variables of every backend
    python -m ktforge.builder.backends registry OUTPUT NAMES    the C++ registry of the compiled ones
                                                        (NAMES: CMake's ';'-separated list)

Both run at configure time (native/CMakeLists.txt), with only the standard library, so a
backend is one row in the table plus its kernel file.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ktforge import formats
from ktforge.detect.features import COMPILER_MACROS

TABLE = Path(__file__).resolve().parent.parent / "data" / "backends.json"
ALWAYS = "reference"  # compiled into the core, without ISA flags: every build has it
# gcc's flag for each feature a compiler macro names (__AVX512VNNI__: -mavx512vnni, __AMX_TILE__: -mamx-tile)
FLAG_FEATURES = {"-m" + macro.strip("_").lower().replace("_", "-"): name for macro, name in COMPILER_MACROS.items()}


@dataclass(frozen=True)
class Backend:
    name: str
    source: str
    table: str
    flags: tuple[str, ...]
    defines: tuple[str, ...]
    host_march: bool
    needs: tuple[str, ...]
    auto: bool
    falls_back_to: str
    summary: str
    builds: str  # all, portable (a level -march=native gives its family's backend) or test

    @property
    def features(self) -> frozenset[str]:
        """The CPU features the level's own flags enable (what it needs where built exactly)."""
        return frozenset(FLAG_FEATURES[f] for f in self.flags if f in FLAG_FEATURES)


@dataclass(frozen=True)
class LibraryBackend:
    """A backend that hands some methods' expert GEMMs to a library (AOCL for amd-blis)."""

    name: str
    library: str
    kernels: str  # the SIMD backend beside it ("auto": the best this CPU runs)
    elsewhere: str  # why the other methods stay on ktforge's kernels
    summary: str

    @property
    def methods(self) -> tuple[str, ...]:
        """The formats the library computes: those whose providers name it (data/formats.json)."""
        return formats.computed_by(self.library)


@functools.cache
def libraries() -> tuple[LibraryBackend, ...]:
    rows = json.loads(TABLE.read_text()).get("libraries", [])
    return tuple(LibraryBackend(**row) for row in rows)


def simd_of(name: str) -> str:
    """The SIMD backend whose instructions a backend runs ('auto' for a library backend)."""
    return next((lib.kernels for lib in libraries() if lib.name == name), name)


@functools.cache
def table() -> tuple[Backend, ...]:
    rows = json.loads(TABLE.read_text())["backends"]
    return tuple(Backend(**{**row, **{k: tuple(row[k]) for k in ("flags", "defines", "needs")}}) for row in rows)


def names() -> tuple[str, ...]:
    """Every SIMD backend, best first, then the reference."""
    return (*(b.name for b in table()), ALWAYS)


def by_name(name: str) -> Backend:
    found = {b.name: b for b in table()}
    if name not in found:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(names())})")
    return found[name]


def host_kinds() -> list[tuple[str, frozenset[str]]]:
    """The kinds of host, richest first, each as the level 'auto' runs there and the features that
    level's betters need and it does not: what KTFORGE_DISABLE_CPU_FEATURES hides on a richer host
    to test as that kind (AMX, AVX-512 with BF16, with VNNI, without VNNI, AVX2, reference)."""
    levels = [b for b in table() if b.auto and b.builds != "test"]
    kinds, above = [], frozenset[str]()
    for level in levels:
        kinds.append((level.name, above - level.features))
        above |= level.features
    return [*kinds, (ALWAYS, above)]


@dataclass(frozen=True)
class Selection:
    """The level backend='auto' runs, and why each better compiled one does not."""

    name: str
    why_not: dict[str, str]


def select(
    compiled: Sequence[tuple[str, Sequence[str]]], has: Callable[[str], bool], amx_granted: Callable[[], bool]
) -> Selection:
    """The choice the kernels' registry makes (kernels/registry.cpp), replayable on any machine's
    facts: the first compiled backend, best first, that 'auto' may choose, whose CPU features this
    CPU has with the OS state they need (``has``), and, if it needs AMX tiles, whose permission
    Linux grants (``amx_granted``, asked only then). ``compiled``: (name, required features)."""
    why_not: dict[str, str] = {}
    for name, required in compiled:
        if name != ALWAYS and not by_name(name).auto:
            continue
        missing = [f for f in required if not has(f)]
        if missing:
            why_not[name] = f"missing {', '.join(missing)}"
        elif "amx_tile" in required and not amx_granted():
            why_not[name] = "Linux refused AMX tile permission (ARCH_REQ_XCOMP_PERM)"
        else:
            return Selection(name, why_not)
    return Selection(ALWAYS, why_not)


def cmake_text() -> str:
    lines = [
        "# Generated by `python -m ktforge.builder.backends cmake` from installer/ktforge/data/backends.json.",
        f"set(KTFORGE_KNOWN_BACKENDS {' '.join(b.name for b in table())})",
    ]
    for b in table():
        flags = " ".join([*b.flags, *(f"-D{d}" for d in b.defines)])
        lines += [
            f"set(KTFORGE_FLAGS_{b.name} {flags})",
            f"set(KTFORGE_DIR_{b.name} {b.source})",
            f"set(KTFORGE_NEEDS_{b.name} {' '.join(b.needs)})",
            f"set(KTFORGE_HOST_MARCH_{b.name} {'ON' if b.host_march else 'OFF'})",
            f"set(KTFORGE_BUILDS_{b.name} {b.builds})",
        ]
    return "\n".join(lines) + "\n"


def registry_text(compiled: list[str]) -> str:
    """The C++ declarations of the compiled backends' tables, best first, and whether 'auto'
    may choose each."""
    chosen = [b for b in table() if b.name in compiled]
    lines = [
        "// Generated by `python -m ktforge.builder.backends registry` from installer/ktforge/data/backends.json.",
        "#pragma once",
        "",
        "#include <string>",
        "",
        '#include "kernels/types.hpp"',
        "",
        "namespace kt {",
        "",
        *(f"extern const KernelTable {b.table};" for b in chosen),
        "",
        "// The compiled SIMD backends, best first (the reference follows them).",
        "#define KTFORGE_COMPILED_BACKENDS " + " ".join(f"&{b.table}," for b in chosen),
        "",
        "// Backends that hand some formats to a library (the provider of that name in the format table),",
        "// beside a SIMD backend for the rest.",
        "struct LibraryBackend {",
        "  const char* name;",
        "  const char* library;",
        "  const char* kernels;",
        "  const char* elsewhere;  // why the formats it does not compute stay on ktforge's kernels",
        "};",
        "inline const LibraryBackend* library_backend(const std::string& name) {",
        "  static const LibraryBackend table[] = {",
        *(f'      {{"{lib.name}", "{lib.library}", "{lib.kernels}", "{lib.elsewhere}"}},' for lib in libraries()),
        "  };",
        "  for (const auto& lib : table)",
        "    if (name == lib.name) return &lib;",
        "  return nullptr;",
        "}",
        "",
        "// Backends that backend='auto' never picks (verification tools).",
        "inline bool auto_may_choose(const std::string& name) {",
        *(f'  if (name == "{b.name}") return false;' for b in table() if not b.auto),
        "  return true;",
        "}",
        "",
        "}  // namespace kt",
    ]
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists() or target.read_text() != text:  # unchanged files keep builds incremental
        target.write_text(text)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "cmake":
        _write(argv[1], cmake_text())
        return 0
    if len(argv) == 3 and argv[0] == "registry":
        compiled = [n for n in argv[2].split(";") if n]
        unknown = [n for n in compiled if n not in names()]
        if unknown:
            print(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(names())}", file=sys.stderr)
            return 2
        _write(argv[1], registry_text(compiled))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
