"""Parsers for the texts a user can hand to ``kt doctor --from``.

Each parser turns one format into :class:`TextCpu`, with flags in Linux spelling
(see :mod:`ktforge.features`). :func:`sniff` recognises the format.
Formats: /proc/cpuinfo (x86, Arm, POWER, RISC-V), ``lscpu`` text (also wrapped or
pasted from Markdown), ``lscpu -J``, raw CPUID dumps (``leaf, subleaf, eax, ebx,
ecx, edx`` per line) and macOS ``sysctl machdep.cpu hw`` output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ktforge.features import SYSCTL_WORDS, known_flag_names


@dataclass(frozen=True)
class TextCpu:
    """What a text dump says about the CPU."""

    arch: str | None  # "x86_64", "aarch64", "ppc64le", "riscv64", ...
    vendor: str | None = None
    brand: str | None = None
    family: int | None = None
    model: int | None = None
    stepping: int | None = None
    flags: frozenset[str] = frozenset()
    hypervisor: str | None = None
    numa_nodes: dict[int, list[int]] = field(default_factory=dict)
    cpus: int | None = None


class DumpFormatError(ValueError):
    """The text is not in any format ``kt doctor --from`` understands."""


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    try:
        return int(value, 0)
    except ValueError:
        return None


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


# --- /proc/cpuinfo ------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> TextCpu:
    first: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "processor":
            processors += 1
        first.setdefault(key, value.strip())
    flags_text = first.get("flags") or first.get("features") or ""
    flags = frozenset(flags_text.split())
    if "vendor_id" in first or "flags" in first:
        arch: str | None = "x86_64" if ("lm" in flags or not flags) else "i686"
    elif "cpu implementer" in first:
        arch = "aarch64"
    elif first.get("cpu", "").upper().startswith("POWER"):
        arch = "ppc64le"
    elif "isa" in first and first["isa"].startswith("rv64"):
        arch = "riscv64"
    else:
        arch = None
    brand = first.get("model name") or first.get("cpu") or None
    return TextCpu(
        arch=arch,
        vendor=first.get("vendor_id"),
        brand=brand,
        family=_int(first.get("cpu family")),
        model=_int(first.get("model")) if arch in ("x86_64", "i686") else None,
        stepping=_int(first.get("stepping")),
        flags=flags,
        hypervisor="unknown" if "hypervisor" in flags else None,
        cpus=processors or None,
    )


# --- lscpu text ---------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_KEY_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9 ()/_.,-]*):\s*(.*)$")


def _unwrap_markdown(text: str) -> list[str]:
    """Drop code fences and quote marks, and the indentation common to all lines."""
    lines = []
    for raw in text.splitlines():
        if _FENCE.match(raw):
            continue
        line = re.sub(r"^\s*>\s?", "", raw) if raw.lstrip().startswith(">") else raw
        lines.append(line.rstrip())
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents, default=0)
    return [line[cut:] for line in lines]


def _join_wrapped_flags(pieces: list[tuple[list[str], bool]]) -> list[str]:
    """Join the flag lines of a wrapped ``Flags:`` field. A piece marked as cut continues
    the previous word; otherwise a word split in two is mended when only the joined
    word is a flag ktforge knows (for pastes whose line lengths were disturbed)."""
    known = known_flag_names()
    words: list[str] = []
    for piece, continues_word in pieces:
        if words and piece:
            tail, head = words[-1], piece[0]
            joined = tail + head
            if continues_word or (joined in known and not (tail in known and head in known)):
                words[-1] = joined
                piece = piece[1:]
        words.extend(piece)
    return words


def _lscpu_fields(text: str) -> dict[str, str]:
    """lscpu's "Key: value" lines, with values that a terminal wrapped onto following lines
    put back together. A line as long as the longest one was cut by the wrap (possibly
    mid-word); a shorter one ended where lscpu ended it."""
    lines = [line for line in _unwrap_markdown(text) if line.strip()]
    width = max((len(line) for line in lines), default=0)
    fields: dict[str, str] = {}
    flag_pieces: list[tuple[list[str], bool]] = []
    key: str | None = None
    previous_cut = False
    for line in lines:
        match = _KEY_LINE.match(line) if not line[0].isspace() else None
        if match and not (key == "Flags" and ":" not in line):
            key, value = match.group(1).strip(), match.group(2).strip()
            if key.lower() == "flags":
                key = "Flags"
                flag_pieces.append((value.split(), False))
            else:
                fields.setdefault(key, value)
        elif key == "Flags":
            flag_pieces.append((line.split(), previous_cut and not line[0].isspace()))
        elif key is not None:
            glue = "" if previous_cut and not line[0].isspace() else " "
            fields[key] = (fields.get(key, "") + glue + line.strip()).strip()
        previous_cut = len(line) == width
    if flag_pieces:
        fields["Flags"] = " ".join(_join_wrapped_flags(flag_pieces))
    return fields


def _from_lscpu_fields(fields: dict[str, str]) -> TextCpu:
    lower = {k.lower(): v for k, v in fields.items()}
    numa: dict[int, list[int]] = {}
    for key, value in lower.items():
        match = re.fullmatch(r"numa node(\d+) cpu\(s\)", key)
        if match and value:
            numa[int(match.group(1))] = parse_cpu_list(value)
    flags = frozenset(lower.get("flags", "").split())
    hypervisor = lower.get("hypervisor vendor") or ("unknown" if "hypervisor" in flags else None)
    return TextCpu(
        arch=lower.get("architecture"),
        vendor=lower.get("vendor id"),
        brand=lower.get("model name"),
        family=_int(lower.get("cpu family")),
        model=_int(lower.get("model")),
        stepping=_int(lower.get("stepping")),
        flags=flags,
        hypervisor=hypervisor,
        numa_nodes=numa,
        cpus=_int(lower.get("cpu(s)")),
    )


def parse_lscpu_text(text: str) -> TextCpu:
    fields = _lscpu_fields(text)
    if "Architecture" not in fields and "Flags" not in fields:
        raise DumpFormatError("this does not look like lscpu output (no Architecture or Flags)")
    return _from_lscpu_fields(fields)


# --- lscpu -J -----------------------------------------------------------------------------


def _walk_lscpu_json(entries: list[Any], fields: dict[str, str]) -> None:
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("field", "")).strip().rstrip(":")
        data = entry.get("data")
        if name and isinstance(data, str):
            fields.setdefault(name, data)
        children = entry.get("children")
        if isinstance(children, list):
            _walk_lscpu_json(children, fields)


def parse_lscpu_json(document: dict[str, Any]) -> TextCpu:
    entries = document.get("lscpu")
    if not isinstance(entries, list):
        raise DumpFormatError('lscpu -J output has a top-level "lscpu" list')
    fields: dict[str, str] = {}
    _walk_lscpu_json(entries, fields)
    return _from_lscpu_fields(fields)


# --- raw CPUID dumps ----------------------------------------------------------------------

_CPUID_ROW = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)(\s*,\s*(0x[0-9a-fA-F]+|\d+)){5}\s*$")


def parse_cpuid_rows(text: str) -> list[list[int]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not _CPUID_ROW.match(line):
            raise DumpFormatError(f"not a CPUID dump row (leaf, subleaf, eax, ebx, ecx, edx): {line!r}")
        rows.append([int(v.strip(), 0) for v in line.split(",")])
    return rows


# --- macOS sysctl -------------------------------------------------------------------------


def parse_sysctl(text: str) -> TextCpu:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    words = " ".join(
        values.get(k, "") for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features", "machdep.cpu.extfeatures")
    ).split()
    flags = frozenset(SYSCTL_WORDS[w] for w in words if w in SYSCTL_WORDS)
    is_arm = values.get("hw.optional.arm64") == "1" or any(k.startswith("hw.optional.arm.") for k in values)
    return TextCpu(
        arch="aarch64" if is_arm else "x86_64",
        vendor=values.get("machdep.cpu.vendor"),
        brand=values.get("machdep.cpu.brand_string"),
        family=_int(values.get("machdep.cpu.family")),
        model=_int(values.get("machdep.cpu.model")),
        stepping=_int(values.get("machdep.cpu.stepping")),
        flags=flags,
        hypervisor="unknown" if "hypervisor" in flags else None,
        cpus=_int(values.get("hw.logicalcpu") or values.get("hw.ncpu")),
    )


# --- format recognition ------------------------------------------------------------------


def sniff(text: str) -> str:
    """Name the format of ``text``: snapshot, lscpu-json, cpuid-dump, sysctl, cpuinfo or lscpu."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise DumpFormatError(f"looks like JSON but does not parse: {exc}") from exc
        if isinstance(document, dict) and "ktforge_snapshot" in document:
            return "snapshot"
        if isinstance(document, dict) and "lscpu" in document:
            return "lscpu-json"
        raise DumpFormatError("JSON, but neither a ktforge snapshot nor `lscpu -J` output")
    body = [line for line in _unwrap_markdown(text) if line.strip()]
    if not body:
        raise DumpFormatError("the file is empty")
    if all(_CPUID_ROW.match(line) for line in body):
        return "cpuid-dump"
    if any(line.startswith(("machdep.cpu.", "hw.")) for line in body[:5]):
        return "sysctl"
    if re.search(r"^\s*processor\s*:", text, re.MULTILINE):
        return "cpuinfo"
    if any(re.match(r"\s*(Architecture|Flags|Vendor ID|Model name)\s*:", line) for line in body):
        return "lscpu"
    raise DumpFormatError(
        "unrecognised text: expected a ktforge snapshot, /proc/cpuinfo, lscpu, lscpu -J, "
        "a raw CPUID dump or macOS sysctl output"
    )
