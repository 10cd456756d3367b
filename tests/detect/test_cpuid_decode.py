"""CPUID decoding on recorded dumps and hand-built leaves."""

from __future__ import annotations

import struct

import pytest

from ktforge.detect.cpuid import decode, leaves_from_rows, os_state_from_xcr0
from ktforge.detect.dumps import parse_cpuid_rows

from ..conftest import CPUINFO_FIXTURES


def _vendor_regs(vendor: str) -> tuple[int, int, int]:
    ebx, edx, ecx = struct.unpack("<III", vendor.encode())
    return ebx, ecx, edx


def _rows(
    leaf7_ebx: int = 0,
    leaf7_ecx: int = 0,
    leaf7_edx: int = 0,
    leaf71_eax: int = 0,
    leaf1_ecx: int = 1 << 27,
    leaf1_eax: int = 0x000A06A1,
) -> list[list[int]]:
    ebx, ecx, edx = _vendor_regs("GenuineIntel")
    return [
        [0, 0, 0x1D, ebx, ecx, edx],
        [1, 0, leaf1_eax, 0, leaf1_ecx, 0],
        [7, 0, 1, leaf7_ebx, leaf7_ecx, leaf7_edx],
        [7, 1, leaf71_eax, 0, 0, 0],
    ]


def test_icelake_dump_decodes_vendor_model_and_avx512() -> None:
    rows = parse_cpuid_rows((CPUINFO_FIXTURES / "windows-cpuid-icelake").read_text())
    facts = decode(leaves_from_rows(rows), None)
    assert facts.vendor == "GenuineIntel"
    assert facts.brand == "11th Gen Intel(R) Core(TM) i7-1185G7 @ 3.00GHz"
    # leaf 1 eax = 526017 = 0x806C1: family 6, extended model 8, model 0xC -> 140, stepping 1
    assert (facts.family, facts.model, facts.stepping) == (6, 140, 1)
    for feature in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi"):
        assert feature in facts.cpu_features, feature
    assert not facts.cpu_features & {"amx_tile", "avx512_bf16", "avx512_fp16"}
    assert facts.os_state.xcr0 is None and facts.os_state.avx512 is None


def test_broadwell_dump_has_avx2_but_no_avx512() -> None:
    rows = parse_cpuid_rows((CPUINFO_FIXTURES / "windows-cpuid-broadwell").read_text())
    facts = decode(leaves_from_rows(rows), None)
    assert {"avx2", "fma", "f16c"} <= facts.cpu_features
    assert "avx512f" not in facts.cpu_features
    assert (facts.family, facts.model) == (6, 0x3D)  # eax 198356 = 0x306D4


def test_amx_bits_and_tile_palette() -> None:
    rows = _rows(leaf7_edx=(1 << 22) | (1 << 24) | (1 << 25), leaf71_eax=(1 << 5) | (1 << 21))
    rows += [[0x1D, 0, 1, 0, 0, 0], [0x1D, 1, (1024 << 16) | 8192, (8 << 16) | 64, 16, 0]]
    facts = decode(leaves_from_rows(rows), 0x600E7)
    assert {"amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "avx512_bf16"} <= facts.cpu_features
    assert facts.tile_palette is not None
    assert (facts.tile_palette.max_names, facts.tile_palette.max_rows, facts.tile_palette.bytes_per_row) == (8, 16, 64)
    assert facts.os_state.amx is True
    assert "amx_tile" in facts.usable_features()


@pytest.mark.parametrize(
    ("xcr0", "avx", "avx512", "amx"),
    [
        (0x7, True, False, False),
        (0xE7, True, True, False),
        (0x600E7, True, True, True),
        (0x3, False, False, False),
        (0x400E7, True, True, False),
    ],
)
def test_xcr0_components(xcr0: int, avx: bool, avx512: bool, amx: bool) -> None:
    state = os_state_from_xcr0(xcr0)
    assert (state.avx, state.avx512, state.amx) == (avx, avx512, amx)


def test_os_without_avx512_state_blocks_avx512_and_amx() -> None:
    rows = _rows(
        leaf7_ebx=(1 << 5) | (1 << 16) | (1 << 30) | (1 << 31), leaf7_edx=1 << 24, leaf1_ecx=(1 << 27) | (1 << 28)
    )
    facts = decode(leaves_from_rows(rows), 0x7)  # x87, SSE, AVX only
    assert "avx512f" in facts.cpu_features
    usable = facts.usable_features()
    assert "avx2" in usable
    assert "avx512f" not in usable and "amx_tile" not in usable


def test_osxsave_clear_means_no_avx_at_all() -> None:
    rows = _rows(leaf7_ebx=1 << 5, leaf1_ecx=1 << 28)  # AVX + AVX2, but OSXSAVE clear
    facts = decode(leaves_from_rows(rows), None)
    assert facts.os_state.avx is False
    assert "avx2" not in facts.usable_features()
    assert any("OSXSAVE" in note for note in facts.notes)


def test_amd_family_uses_extended_family() -> None:
    ebx, ecx, edx = _vendor_regs("AuthenticAMD")
    rows = [[0, 0, 0x10, ebx, ecx, edx], [1, 0, 0x00A10F11, 0, 0, 0]]  # Genoa: family 0x19, model 0x11
    facts = decode(leaves_from_rows(rows), None)
    assert facts.vendor == "AuthenticAMD"
    assert (facts.family, facts.model, facts.stepping) == (25, 17, 1)


def test_missing_leaf0_and_bad_rows_raise_value_error() -> None:
    with pytest.raises(ValueError, match="leaf 0"):
        decode(leaves_from_rows([[1, 0, 0, 0, 0, 0]]), None)
    with pytest.raises(ValueError, match="6 numbers"):
        leaves_from_rows([[1, 2, 3]])
