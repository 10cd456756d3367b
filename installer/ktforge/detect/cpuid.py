"""Decoding raw CPUID leaves and XCR0 into facts. Pure: no CPUID instruction is executed here.

The live probe (probes/cpu.c) and recorded dumps produce the same input: a list of
``[leaf, subleaf, eax, ebx, ecx, edx]`` rows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ktforge.detect.features import (
    AMX_FAMILY,
    AVX512_FAMILY,
    AVX_FAMILY,
    CPUID_BITS,
    XCR0_AMX_BITS,
    XCR0_AVX512_BITS,
    XCR0_AVX_BITS,
)

Leaves = dict[tuple[int, int], tuple[int, int, int, int]]
_REGISTER_INDEX = {"eax": 0, "ebx": 1, "ecx": 2, "edx": 3}


@dataclass(frozen=True)
class TilePalette:
    """CPUID leaf 0x1D subleaf 1: the AMX palette-1 geometry."""

    total_tile_bytes: int
    bytes_per_tile: int
    bytes_per_row: int
    max_names: int
    max_rows: int


@dataclass(frozen=True)
class OsState:
    """Which register state the OS has enabled in XCR0 (None: XCR0 not known)."""

    xcr0: int | None
    avx: bool | None
    avx512: bool | None
    amx: bool | None


@dataclass(frozen=True)
class CpuidFacts:
    vendor: str
    brand: str
    family: int | None
    model: int | None
    stepping: int | None
    cpu_features: frozenset[str]  # what the silicon (or hypervisor) advertises
    os_state: OsState
    tile_palette: TilePalette | None = None
    max_basic_leaf: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def usable_features(self) -> frozenset[str]:
        """Features the CPU has *and* the OS has enabled state for (unknown state: trusted)."""
        blocked: set[str] = set()
        if self.os_state.avx is False:
            blocked |= AVX_FAMILY | AVX512_FAMILY | AMX_FAMILY
        if self.os_state.avx512 is False:
            blocked |= AVX512_FAMILY
        if self.os_state.amx is False:
            blocked |= AMX_FAMILY
        return self.cpu_features - blocked


def leaves_from_rows(rows: Iterable[Sequence[int]]) -> Leaves:
    leaves: Leaves = {}
    for row in rows:
        if len(row) != 6:
            raise ValueError(f"a CPUID row has 6 numbers (leaf, subleaf, eax, ebx, ecx, edx): {row!r}")
        leaf, sub, a, b, c, d = (int(v) for v in row)
        leaves[(leaf, sub)] = (a & 0xFFFFFFFF, b & 0xFFFFFFFF, c & 0xFFFFFFFF, d & 0xFFFFFFFF)
    return leaves


def _regs_to_text(*regs: int) -> str:
    return struct.pack("<" + "I" * len(regs), *regs).decode("ascii", "replace").strip("\x00 ")


def os_state_from_xcr0(xcr0: int | None) -> OsState:
    if xcr0 is None:
        return OsState(None, None, None, None)
    return OsState(
        xcr0=xcr0,
        avx=(xcr0 & XCR0_AVX_BITS) == XCR0_AVX_BITS,
        avx512=(xcr0 & (XCR0_AVX_BITS | XCR0_AVX512_BITS)) == (XCR0_AVX_BITS | XCR0_AVX512_BITS),
        amx=(xcr0 & XCR0_AMX_BITS) == XCR0_AMX_BITS,
    )


def decode(leaves: Leaves, xcr0: int | None) -> CpuidFacts:
    if (0, 0) not in leaves:
        raise ValueError("CPUID leaf 0 is missing: cannot tell the vendor or the highest leaf")
    max_basic, ebx0, ecx0, edx0 = leaves[(0, 0)]
    vendor = _regs_to_text(ebx0, edx0, ecx0)

    features: set[str] = set()
    for (leaf, sub, reg), bits in CPUID_BITS.items():
        values = leaves.get((leaf, sub))
        if values is None:
            continue
        word = values[_REGISTER_INDEX[reg]]
        features.update(name for bit, name in bits.items() if word >> bit & 1)

    family = model = stepping = None
    if (1, 0) in leaves:
        eax = leaves[(1, 0)][0]
        stepping = eax & 0xF
        base_family = (eax >> 8) & 0xF
        base_model = (eax >> 4) & 0xF
        family = base_family + ((eax >> 20) & 0xFF if base_family == 0xF else 0)
        model = base_model
        if base_family in (0x6, 0xF):
            model += ((eax >> 16) & 0xF) << 4

    brand_rows = [leaves.get((leaf, 0)) for leaf in (0x80000002, 0x80000003, 0x80000004)]
    brand = ""
    if all(row is not None for row in brand_rows):
        brand = _regs_to_text(*(reg for row in brand_rows if row is not None for reg in row))

    palette = None
    if (0x1D, 1) in leaves and leaves.get((0x1D, 0), (0,))[0] >= 1:
        a, b, c, _ = leaves[(0x1D, 1)]
        palette = TilePalette(a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16, c & 0xFFFF)

    notes: list[str] = []
    os_state = os_state_from_xcr0(xcr0)
    if xcr0 is None and "osxsave" in features:
        notes.append("XCR0 was not read: OS register state is unknown")
    if "osxsave" not in features and features & (AVX_FAMILY | AVX512_FAMILY | AMX_FAMILY):
        # Without OSXSAVE the OS has not enabled XSAVE-managed state: no AVX at all.
        os_state = OsState(xcr0, False, False, False)
        notes.append("CPUID.1:ECX.OSXSAVE is clear: the OS has not enabled AVX state")

    return CpuidFacts(
        vendor=vendor,
        brand=brand,
        family=family,
        model=model,
        stepping=stepping,
        cpu_features=frozenset(features),
        os_state=os_state,
        tile_palette=palette,
        max_basic_leaf=max_basic,
        notes=tuple(notes),
    )
