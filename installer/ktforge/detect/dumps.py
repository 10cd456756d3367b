"""Parsers for the texts a user can hand to ``kt doctor --from``.

Each parser turns one format into :class:`TextCpu`, with flags in Linux spelling
(see :mod:`ktforge.detect.features`). :func:`sniff` recognises the format.
Formats: /proc/cpuinfo (x86, Arm, POWER, RISC-V), ``lscpu`` text (also wrapped or
pasted from Markdown), ``lscpu -J``, raw CPUID dumps (``leaf, subleaf, eax, ebx,
ecx, edx`` per line) and macOS ``sysctl machdep.cpu hw`` output.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal

from ktforge.detect.features import SYSCTL_WORDS, known_flag_names
from ktforge.resources import data_path


@dataclass(frozen=True)
class TextCpu:
    """What a text dump says about the CPU."""

    arch: str | None  # "x86_64", "aarch64", "ppc64le", "riscv64", ...
    vendor: str | None = None
    brand: str | None = None
    family: int | None = None
    model: int | None = None
    stepping: int | None = None
    flags: frozenset[str] | None = frozenset()  # None: the dump has no flag list at all
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
    flags_text = first.get("flags", first.get("features"))
    flags = frozenset(flags_text.split()) if flags_text is not None else None
    if "vendor_id" in first or "flags" in first:
        arch: str | None = "x86_64" if (not flags or "lm" in flags) else "i686"
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
        hypervisor="unknown" if flags and "hypervisor" in flags else None,
        cpus=processors or None,
    )


# --- pasted text: what surrounds a dump ----------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")
_QUOTE = re.compile(r"^\s*(>\s?)+")
# A shell prompt and the command that printed the dump ("user@host:~$ lscpu", "# LANG=C
# lscpu -J", "PS C:\\> cat /proc/cpuinfo"), or a prompt left alone on a line after it.
_COMMAND = re.compile(
    r"^.{0,80}?(^|[\s$#%>\u276f])(sudo\s+)?(env\s+)?(\w+=\S*\s+)*(\S*/)?"
    r"(lscpu(\s+-[-\w=]+)*|cat\s+/proc/cpuinfo|sysctl\s.*)\s*$"
)
_BARE_PROMPT = re.compile(r"^\s*(\[?[\w.-]+@[\w.-]+[^$#%>]*\]?\s*)?[$#%>\u276f]\s*$")


def clean_paste(text: str) -> list[str]:
    """The lines of a pasted dump without what surrounds it: CR/CRLF line ends, terminal
    escape sequences, Markdown fences, quote markers and indentation common to all lines,
    and shell prompts with the command that printed the dump. Trailing spaces are kept
    (a terminal wrap that fell on a space leaves one); tabs become spaces."""
    lines = []
    for raw in _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if _FENCE.match(raw):
            continue
        line = _QUOTE.sub("", raw, count=1) if raw.lstrip().startswith(">") else raw
        line = line.expandtabs(8)
        if _COMMAND.match(line) or _BARE_PROMPT.match(line):
            continue
        lines.append(line)
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents, default=0)
    return [line[cut:] for line in lines]


# --- lscpu labels, in every language util-linux prints ------------------------------------


@functools.cache
def _label_table() -> tuple[dict[str, str], tuple[tuple[re.Pattern[str], str], ...]]:
    """casefolded label -> lscpu's English label, and patterns for numbered labels
    ("NUMA node%d CPU(s)"), from util-linux's catalogs (data/lscpu_labels.json)."""
    raw = json.loads(data_path("lscpu_labels.json").read_text(encoding="utf-8"))["labels"]
    labels: dict[str, str] = {}
    patterns = []
    for english, translations in raw.items():
        for label in (english, *translations.values()):
            if "%d" in label:
                parts = [re.escape(p) for p in label.split("%d")]
                pattern = re.compile(r"\s*".join(["", r"(\d+)".join(parts), ""]), re.IGNORECASE)
                patterns.append((pattern, english))
            else:
                labels[label.casefold()] = english
    return labels, tuple(patterns)


def canonical_label(label: str) -> str | None:
    """lscpu's English label for a label in any language it prints ('架构' -> 'Architecture';
    'NUMA-Knoten1 CPU(s)' -> 'NUMA node1 CPU(s)'), or None for a label ktforge does not read."""
    label = label.strip().rstrip(":\uff1a").strip()
    labels, patterns = _label_table()
    if (english := labels.get(label.casefold())) is not None:
        return english
    for pattern, english in patterns:
        if match := pattern.fullmatch(label):
            return english.replace("%d", match.group(1))
    return None


# --- lscpu text ---------------------------------------------------------------------------

# "Label: value" in any language: the label runs to the first colon (ASCII or full-width).
_FIELD_LINE = re.compile(r"^(?P<indent> *)(?P<label>[^\s:\uff1a][^:\uff1a]*?)\s*[:\uff1a](?:\s+(?P<value>.*?))?\s*$")


def _display_width(text: str) -> int:
    """Terminal columns of ``text``: East Asian wide characters take two."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


# How a line continues the one before it: "space" (a separator is visible: the space the
# wrap fell on, or one more space of indentation than the other continuation lines), "cut" (the line
# before filled the terminal: the wrap fell inside a word, unless the vocabulary says
# otherwise), or None (nothing tells: words are kept apart unless the vocabulary joins them).
Seam = str | None


def _join_words(pieces: list[tuple[list[str], Seam]]) -> list[str]:
    """Join wrapped pieces of a word list (the Flags field) at their seams."""
    known = known_flag_names()
    words: list[str] = []
    for piece, seam in pieces:
        if words and piece and seam != "space":
            tail, head = words[-1], piece[0]
            joined = tail + head
            both_known = tail in known and head in known
            # "cut": one word, unless it was two known flags; otherwise two words, unless only
            # the joined word is a known flag
            glue = not (both_known and joined not in known) if seam == "cut" else joined in known and not both_known
            if glue:
                words[-1] = joined
                piece = piece[1:]
        words.extend(piece)
    return words


def _lscpu_fields(text: str) -> dict[str, str]:
    """lscpu's fields by English label, from its flat (piped) or nested (terminal) layout,
    in any language, with values that a terminal wrapped onto following lines put back."""
    lines = [line for line in clean_paste(text) if line.strip()]
    width = max((_display_width(line.rstrip()) for line in lines), default=0)
    parsed = [(line, _FIELD_LINE.match(line)) for line in lines]
    value_columns = [
        _display_width(line[: m.start("value")]) for line, m in parsed if m and m.group("value") is not None
    ]
    value_column = max(set(value_columns), key=value_columns.count) if value_columns else 0
    pieces: dict[str, list[tuple[str, int, Seam]]] = {}  # field -> its lines (text, indent, seam)
    key: str | None = None
    previous = ""
    for line, match in parsed:
        english = canonical_label(match.group("label")) if match else None
        # A line with a label ktforge reads, or any "label: value" line that is not indented
        # into the value column, starts a field; anything else continues the current one
        # (flags never hold a colon; a wrapped text value may: "...; BHI: Not affected").
        if match is not None and (english is not None or _indent(line) < value_column - 1 or not value_column):
            key = english or f"?{match.group('label')}"
            if key in pieces:
                key = f"?duplicate {key}"  # a second "Model name" (BIOS) and the like: ignored
            pieces[key] = [((match.group("value") or "").strip(), 0, None)]
        elif key is not None:
            # A line filled to the terminal's width was cut by the wrap; one that stops a
            # column short with a space left (not trimmed) was cut at that space. A paste
            # may pad every line with spaces: only the visible width counts.
            shown = _display_width(previous.rstrip())
            if shown >= width:
                seam: Seam = "cut"
            elif shown == width - 1 and previous.endswith(" ") and not previous.endswith("  "):
                seam = "space"
            else:
                seam = None
            pieces[key].append((line.strip(), _indent(line), seam))
        previous = line
    fields: dict[str, str] = {}
    for key, parts in pieces.items():
        if key.startswith("?"):
            continue
        if len(parts) == 1:
            fields[key] = parts[0][0]
            continue
        # continuation lines sit at one indentation; one space more shows the wrap fell on a space
        base = min(indent for _, indent, _ in parts[1:])
        seams = [(text, "space" if indent > base else seam) for text, indent, seam in parts]
        if key == "Flags":
            fields[key] = " ".join(_join_words([(t.split(), s) for t, s in seams]))
        else:
            value = seams[0][0]
            for text_piece, seam in seams[1:]:
                value += ("" if seam == "cut" else " ") + text_piece
            fields[key] = value.strip()
    return fields


def _from_lscpu_fields(fields: dict[str, str]) -> TextCpu:
    numa: dict[int, list[int]] = {}
    for key, value in fields.items():
        match = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
        if match and value:
            with contextlib.suppress(ValueError):
                numa[int(match.group(1))] = parse_cpu_list(value)
    flags = frozenset(fields["Flags"].split()) if "Flags" in fields else None
    hypervisor = fields.get("Hypervisor vendor") or ("unknown" if flags and "hypervisor" in flags else None)
    arch = fields.get("Architecture") or ("x86_64" if flags and "lm" in flags else None)
    return TextCpu(
        arch=arch,
        vendor=fields.get("Vendor ID"),
        brand=fields.get("Model name"),
        family=_int(fields.get("CPU family")),
        model=_int(fields.get("Model")),
        stepping=_int(fields.get("Stepping")),
        flags=flags,
        hypervisor=hypervisor,
        numa_nodes=numa,
        cpus=_int(fields.get("CPU(s)")),
    )


_LSCPU_MARKERS = frozenset({"Architecture", "Flags", "Vendor ID", "Model name"})


def parse_lscpu_text(text: str) -> TextCpu:
    fields = _lscpu_fields(text)
    if not _LSCPU_MARKERS & fields.keys():
        raise DumpFormatError("this does not look like lscpu output (no Architecture, Vendor ID, Model name or Flags)")
    return _from_lscpu_fields(fields)


# --- lscpu -J -----------------------------------------------------------------------------


def _walk_lscpu_json(entries: list[Any], fields: dict[str, str]) -> None:
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        label = canonical_label(str(entry.get("field", "")))
        data = entry.get("data")
        if label and isinstance(data, str):
            fields.setdefault(label, data.strip())
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


def json_document(text: str) -> Any:
    """The JSON document a paste holds (a prompt line or a fence around it allowed), or None
    when it is not JSON."""
    stripped = text.lstrip()
    if not stripped.startswith("{"):
        stripped = "\n".join(clean_paste(text)).strip()
        if not stripped.startswith("{"):
            return None
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise DumpFormatError(f"looks like JSON but does not parse: {exc}") from exc
    except RecursionError:
        raise DumpFormatError("looks like JSON but is nested too deeply to be a dump or snapshot") from None


def sniff(text: str) -> Literal["snapshot", "lscpu-json", "cpuid-dump", "sysctl", "cpuinfo", "lscpu"]:
    """Name the format of ``text``: snapshot, lscpu-json, cpuid-dump, sysctl, cpuinfo or lscpu."""
    document = json_document(text)
    if document is not None:
        if isinstance(document, dict) and "ktforge_snapshot" in document:
            return "snapshot"
        if isinstance(document, dict) and "lscpu" in document:
            return "lscpu-json"
        raise DumpFormatError("JSON, but neither a ktforge snapshot nor `lscpu -J` output")
    body = [line.rstrip() for line in clean_paste(text) if line.strip()]
    if not body:
        raise DumpFormatError("the file is empty")
    if all(_CPUID_ROW.match(line) for line in body):
        return "cpuid-dump"
    if any(line.startswith(("machdep.cpu.", "hw.")) for line in body[:5]):
        return "sysctl"
    if re.search(r"^\s*processor\s*:", text, re.MULTILINE):
        return "cpuinfo"
    if any((m := _FIELD_LINE.match(line)) and canonical_label(m.group("label")) in _LSCPU_MARKERS for line in body):
        return "lscpu"
    raise DumpFormatError(
        "unrecognised text: expected a ktforge snapshot, /proc/cpuinfo, lscpu, lscpu -J, "
        "a raw CPUID dump or macOS sysctl output"
    )
