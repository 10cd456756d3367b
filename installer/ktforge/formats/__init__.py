"""The weight formats, read from one table (``data/formats.json``).

A format is a row: its element type, K padding and groups, scale and zero-point, the providers
that compute it and the names checkpoints use for it. Python reads the rows here; C++ gets
them generated (``python -m ktforge.formats cpp FOLDER``, at configure time, with only the
standard library). Neither ``kernels/`` nor ``checkpoints/`` is imported from here: both
build on it.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "data" / "formats.json"
ELEMENTS = (
    "bf16",
    "int8",
    "int4",
    "int8g",
    "fp8",
    "fp4",
    "int4z",
    "q4k",
    "int8h",
    "q6k",
    "q5k",
    "iq4nl",
    "iq4xs",
    "q3k",
    "q2k",
    "iq2xxs",
    "iq2xs",
    "iq3xxs",
    "iq1s",
    "q40",
    "q41",
    "q50",
    "q51",
    "f16",
    "f32",
    "nvfp4",
    "mxfp8",
)  # the packed value families the SIMD kernels compute
KERNELS = "kernels"  # the provider that is the selected backend's kernel table


@dataclass(frozen=True)
class Scale:
    type: str  # f32
    per: str  # row, group or block (a 16-row block's group of K)


@dataclass(frozen=True)
class SuperBlock:
    values: int  # of K a super-block covers (K is padded to it)
    scales: tuple[str, ...]  # the types of its scales (q4_k: d and dmin, float16)


@dataclass(frozen=True)
class CheckpointNames:
    weight_dtype: str  # safetensors dtype kt convert writes
    scale_dtype: str | None
    names: tuple[str, ...]


@dataclass(frozen=True)
class Format:
    name: str
    element: str
    bits: int
    k_step: int  # 0: the group size
    group_sizes: tuple[int, ...]
    scale: Scale | None
    zero_point: Scale | None
    activations: str
    providers: dict[str, str]  # provider -> what it runs, preferred first
    checkpoint: CheckpointNames
    super_block: SuperBlock | None = None
    activation_block: str | int | None = None  # int8 activations: "group", "super_block", "row" or values
    global_scale: Scale | None = None  # a scale over the whole tensor, kept per row (nvfp4's)

    def activation_values(self, group_size: int, kp: int) -> int:
        """Values of K one int8 activation scale covers, at a group size and a K (padded here)."""
        if isinstance(self.activation_block, int):  # the largest divisor of the padded K up to it
            step = self.k_step or group_size
            return math.gcd(self.activation_block, -(-kp // step) * step)
        if self.activation_block == "group":
            return group_size
        if self.activation_block == "super_block" and self.super_block is not None:
            return self.super_block.values
        if self.activation_block == "row":
            return kp
        raise ValueError(f"format {self.name!r} has no int8 activations")

    @property
    def grouped(self) -> bool:
        return bool(self.group_sizes)

    def bytes_per_weight(self, group_size: int = 0) -> float:
        """Bytes a weight takes, its scale's (and zero point's) share included; per-row and
        per-block metadata count as nothing (one value per K, or per 16 x group, weights)."""
        extra = 0.0
        for part in (self.scale, self.zero_point):
            if part is not None and part.per == "group":
                extra += _type_bytes(part.type) / (group_size or self.group_sizes[0])
        if self.super_block is not None:
            extra += sum(_type_bytes(t) for t in self.super_block.scales) / self.super_block.values
        return self.bits / 8 + extra


def _type_bytes(name: str) -> float:
    return {"f32": 4, "f16": 2, "bf16": 2, "e8m0": 1, "ue4m3": 1, "u16": 2, "u8": 1, "i8": 1, "u4": 0.5}[name]


def _format(row: dict[str, object]) -> Format:
    fields = dict(row)
    for key in ("scale", "zero_point", "global_scale"):
        part = fields.get(key)
        fields[key] = Scale(**part) if isinstance(part, dict) else None
    checkpoint = dict(fields["checkpoint"])  # type: ignore[call-overload]
    fields["checkpoint"] = CheckpointNames(**{**checkpoint, "names": tuple(checkpoint["names"])})
    fields["group_sizes"] = tuple(fields["group_sizes"])  # type: ignore[arg-type]
    if isinstance(fields.get("super_block"), dict):
        block = dict(fields["super_block"])  # type: ignore[call-overload]
        fields["super_block"] = SuperBlock(int(block["values"]), tuple(block["scales"]))
    made = Format(**fields)  # type: ignore[arg-type]
    if made.element not in ELEMENTS:
        raise ValueError(f"format {made.name!r}: element {made.element!r} is none of {', '.join(ELEMENTS)}")
    if len(made.group_sizes) > 4 or len(made.providers) > 4:
        raise ValueError(f"format {made.name!r}: at most 4 group sizes and 4 providers (formats.gen.hpp's arrays)")
    numeric = type(made.activation_block) is int and made.activation_block > 0 and made.activation_block % 4 == 0
    if (made.activation_block not in (None, "group", "super_block", "row") and not numeric) or (
        made.activation_block == "super_block" and made.super_block is None
    ):
        raise ValueError(f"format {made.name!r}: activation_block {made.activation_block!r} is not one it can have")
    if made.k_step == 0 and not made.group_sizes:
        raise ValueError(f"format {made.name!r}: k_step 0 (the group size) needs group_sizes")
    return made


@functools.cache
def table() -> tuple[Format, ...]:
    return tuple(_format(row) for row in json.loads(TABLE.read_text())["formats"])


def names() -> tuple[str, ...]:
    return tuple(f.name for f in table())


def by_name(name: str) -> Format:
    for f in table():
        if f.name == name:
            return f
    raise ValueError(f"method must be one of {', '.join(names())}, got {name!r}")


def check_group(name: str, group_size: int, option: str = "group_size") -> None:
    """ValueError unless ``group_size`` is one this format takes (any, for an ungrouped one),
    naming the setting as the caller's user spells it (``option``)."""
    f = by_name(name)
    if f.grouped and group_size not in f.group_sizes:
        raise ValueError(f"{option} must be {spoken_list(f.group_sizes)}, got {group_size!r}")


def default_group(name: str) -> int:
    """The group a format takes when none is asked for: 128 where it takes 128 (and for formats
    without groups), else its largest (Q4_K's and MXFP4's 32, its only one)."""
    sizes = by_name(name).group_sizes
    return 128 if not sizes or 128 in sizes else max(sizes)


def group_for(name: str, group_size: int) -> int:
    """The group a format runs at for a requested one: its only group size where it has one
    (mxfp4's 32, whatever was asked for all formats at once), else the request."""
    sizes = by_name(name).group_sizes
    return sizes[0] if len(sizes) == 1 else group_size


def spoken_list(values: tuple[int, ...]) -> str:
    """(32, 64, 128) -> '32, 64 or 128'."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def computed_by(library: str) -> tuple[str, ...]:
    """The formats whose expert GEMMs a library provider computes."""
    return tuple(f.name for f in table() if library in f.providers)


def cpp_text() -> str:
    """The rows as C++: the Method enum (one value a format), each format's element family
    (kt::Element, which the kernels switch on) and geometry, and its providers."""
    rows = table()
    formats = ", ".join(f.name.replace("-", "_") for f in rows)

    def row(f: Format) -> str:
        groups = ", ".join(map(str, f.group_sizes))
        providers = ", ".join(f'"{p}"' for p in f.providers)
        return (
            f'    {{"{f.name}", Element::{f.element}, {f.bits}, {f.k_step}, {{{groups}}}, {len(f.group_sizes)}, '
            f"{{{providers}}}, {len(f.providers)}}},"
        )

    lines = [
        "// Generated by `python -m ktforge.formats cpp` from installer/ktforge/data/formats.json.",
        "#pragma once",
        "",
        "#include <stdexcept>",
        "#include <string>",
        "",
        "namespace kt {",
        "",
        "// The packed value families the SIMD kernels compute.",
        f"enum class Element {{ {', '.join(ELEMENTS)} }};",
        "// The weight formats, in the table's order.",
        f"enum class Method {{ {formats} }};",
        "",
        "struct FormatInfo {",
        "  const char* name;",
        "  Element element;",
        "  int bits;",
        "  int k_step;  // 0: the group size",
        "  int group_sizes[4];",
        "  int group_count;",
        '  const char* providers[4];  // preferred first; "kernels": the backend\'s kernel table',
        "  int provider_count;",
        "};",
        "",
        "inline const FormatInfo& format_info(Method m) {",
        "  static const FormatInfo table[] = {",
        *(row(f) for f in rows),
        "  };",
        "  return table[static_cast<int>(m)];",
        "}",
        f"constexpr int kFormatCount = {len(rows)};",
        "",
        "// Values of K one int8 activation scale covers, by element family (formats.json's activation_block):",
        "// 0 the weights' group, -1 the whole row, else that many or fewer (types.hpp's activation_block).",
        f"constexpr int kActivationBlocks[] = {{{', '.join(map(str, _activation_blocks()))}}};",
        "",
        "inline Element element_of(Method m) { return format_info(m).element; }",
        "inline const char* method_name(Method m) { return format_info(m).name; }",
        "inline Method parse_method(const std::string& name) {",
        "  std::string known;",
        "  for (int i = 0; i < kFormatCount; ++i) {",
        "    const Method m = static_cast<Method>(i);",
        "    if (name == format_info(m).name) return m;",
        '    known += (known.empty() ? "\'" : ", \'") + std::string(format_info(m).name) + "\'";',
        "  }",
        '  throw std::invalid_argument("method must be one of " + known + ", not \'" + name + "\'");',
        "}",
        "inline bool takes_group(Method m, int group) {",
        "  const FormatInfo& f = format_info(m);",
        "  for (int i = 0; i < f.group_count; ++i)",
        "    if (f.group_sizes[i] == group) return true;",
        "  return f.group_count == 0;",
        "}",
        '// "32, 64 or 128": the group sizes a format takes, for messages.',
        "inline std::string group_sizes_text(Method m) {",
        "  const FormatInfo& f = format_info(m);",
        "  std::string text;",
        "  for (int i = 0; i < f.group_count; ++i)",
        '    text += (i == 0 ? "" : i + 1 == f.group_count ? " or " : ", ") + std::to_string(f.group_sizes[i]);',
        "  return text;",
        "}",
        "",
        "}  // namespace kt",
    ]
    return "\n".join(lines) + "\n"


def _activation_blocks() -> list[int]:
    """Each element family's activation block for C++ (0: group, -1: row, else values), the same in
    every format of a family."""
    codes: dict[str, int] = {}
    for f in table():
        if f.activation_block is None:
            continue
        code = (
            f.activation_block
            if isinstance(f.activation_block, int)
            else {"group": 0, "row": -1}.get(f.activation_block, f.super_block.values if f.super_block else 0)
        )
        if codes.setdefault(f.element, code) != code:
            raise ValueError(f"format {f.name!r}: element {f.element!r} has two activation blocks")
    return [codes.get(e, -1) for e in ELEMENTS]


def providers_text() -> str:
    """The factory of every provider the table names, by name: each is the function
    ``make_<name>_provider`` of ``native/src/providers/<name>.cpp``."""
    names = sorted({p for f in table() for p in f.providers})
    ident = {name: name.replace("-", "_") for name in names}
    lines = [
        "// Generated by `python -m ktforge.formats cpp` from installer/ktforge/data/formats.json.",
        "#pragma once",
        "",
        "#include <string>",
        "",
        '#include "moe/provider.hpp"',
        "",
        "namespace kt {",
        "",
        *(f"std::unique_ptr<Provider> make_{ident[n]}_provider(const ProviderContext& context);" for n in names),
        "",
        "inline ProviderFactory provider_factory(const std::string& name) {",
        *(f'  if (name == "{n}") return &make_{ident[n]}_provider;' for n in names),
        "  return nullptr;",
        "}",
        "",
        "}  // namespace kt",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "cpp":
        folder = Path(argv[1])
        folder.mkdir(parents=True, exist_ok=True)
        from ktforge.formats import lattice

        generated = (
            ("formats.gen.hpp", cpp_text()),
            ("providers.gen.hpp", providers_text()),
            ("lattice_grids.gen.hpp", lattice.cpp_text()),
        )
        for name, text in generated:
            target = folder / name
            if not target.exists() or target.read_text() != text:  # unchanged files keep builds incremental
                target.write_text(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2
