"""CPU feature vocabulary: Linux /proc/cpuinfo flag names, CPUID bit positions, XCR0 components.

Every other module names features with these spellings; CPUID bits, lscpu, cpuinfo and
macOS sysctl dumps are all translated into them here and nowhere else.
"""

from __future__ import annotations

from typing import Final

# (leaf, subleaf, register) -> {bit: linux flag name}
CPUID_BITS: Final[dict[tuple[int, int, str], dict[int, str]]] = {
    (1, 0, "ecx"): {
        0: "pni",
        1: "pclmulqdq",
        9: "ssse3",
        12: "fma",
        13: "cx16",
        19: "sse4_1",
        20: "sse4_2",
        22: "movbe",
        23: "popcnt",
        25: "aes",
        26: "xsave",
        27: "osxsave",
        28: "avx",
        29: "f16c",
        30: "rdrand",
        31: "hypervisor",
    },
    (1, 0, "edx"): {23: "mmx", 25: "sse", 26: "sse2"},
    (7, 0, "ebx"): {
        0: "fsgsbase",
        1: "tsc_adjust",
        3: "bmi1",
        5: "avx2",
        8: "bmi2",
        16: "avx512f",
        17: "avx512dq",
        18: "rdseed",
        19: "adx",
        21: "avx512ifma",
        23: "clflushopt",
        24: "clwb",
        26: "avx512pf",
        27: "avx512er",
        28: "avx512cd",
        29: "sha_ni",
        30: "avx512bw",
        31: "avx512vl",
    },
    (7, 0, "ecx"): {
        1: "avx512vbmi",
        3: "pku",
        5: "waitpkg",
        6: "avx512_vbmi2",
        8: "gfni",
        9: "vaes",
        10: "vpclmulqdq",
        11: "avx512_vnni",
        12: "avx512_bitalg",
        14: "avx512_vpopcntdq",
        22: "rdpid",
        25: "cldemote",
        27: "movdiri",
        28: "movdir64b",
    },
    (7, 0, "edx"): {
        8: "avx512_vp2intersect",
        14: "serialize",
        22: "amx_bf16",
        23: "avx512_fp16",
        24: "amx_tile",
        25: "amx_int8",
        28: "flush_l1d",
    },
    (7, 1, "eax"): {
        0: "sha512",
        1: "sm3",
        2: "sm4",
        4: "avx_vnni",
        5: "avx512_bf16",
        7: "cmpccxadd",
        21: "amx_fp16",
        23: "avx_ifma",
    },
    (7, 1, "edx"): {4: "avx_vnni_int8", 5: "avx_ne_convert", 10: "avx_vnni_int16"},
    (0xD, 1, "eax"): {0: "xsaveopt", 1: "xsavec"},
    (0x80000001, 0, "ecx"): {0: "lahf_lm", 5: "abm", 6: "sse4a", 11: "xop", 16: "fma4", 21: "tbm"},
    (0x80000001, 0, "edx"): {29: "lm", 30: "3dnowext", 31: "3dnow"},
    (0x80000008, 0, "ebx"): {0: "clzero"},
}

# XCR0 state components the kernels depend on (Intel SDM vol. 1, 13.1).
XCR0_AVX_BITS: Final = (1 << 1) | (1 << 2)  # SSE, AVX (YMM upper halves)
XCR0_AVX512_BITS: Final = (1 << 5) | (1 << 6) | (1 << 7)  # opmask, ZMM_Hi256, Hi16_ZMM
XCR0_AMX_BITS: Final = (1 << 17) | (1 << 18)  # XTILECFG, XTILEDATA
XFEATURE_XTILEDATA: Final = 18

# Which OS state each feature needs before it may execute.
AVX_FAMILY: Final = frozenset({"avx", "avx2", "fma", "f16c", "avx_vnni", "vaes", "vpclmulqdq"})
AVX512_FAMILY: Final = frozenset(
    {
        "avx512f",
        "avx512dq",
        "avx512ifma",
        "avx512cd",
        "avx512bw",
        "avx512vl",
        "avx512vbmi",
        "avx512_vbmi2",
        "avx512_vnni",
        "avx512_bitalg",
        "avx512_vpopcntdq",
        "avx512_bf16",
        "avx512_fp16",
        "avx512pf",
        "avx512er",
        "avx512_vp2intersect",
    }
)
AMX_FAMILY: Final = frozenset({"amx_tile", "amx_int8", "amx_bf16", "amx_fp16"})

# The features doctor reports one by one, in display order.
REPORTED: Final = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512cd",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_vbmi2",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",
)

# macOS sysctl machdep.cpu.{features,leaf7_features,extfeatures} words -> linux names.
SYSCTL_WORDS: Final[dict[str, str]] = {
    "SSE": "sse",
    "SSE2": "sse2",
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "SSE4.1": "sse4_1",
    "SSE4.2": "sse4_2",
    "FMA": "fma",
    "AVX1.0": "avx",
    "F16C": "f16c",
    "AVX2": "avx2",
    "POPCNT": "popcnt",
    "MOVBE": "movbe",
    "AES": "aes",
    "PCLMULQDQ": "pclmulqdq",
    "XSAVE": "xsave",
    "OSXSAVE": "osxsave",
    "RDRAND": "rdrand",
    "BMI1": "bmi1",
    "BMI2": "bmi2",
    "ADX": "adx",
    "RDSEED": "rdseed",
    "SHA": "sha_ni",
    "VMM": "hypervisor",
    "AVX512F": "avx512f",
    "AVX512DQ": "avx512dq",
    "AVX512CD": "avx512cd",
    "AVX512BW": "avx512bw",
    "AVX512VL": "avx512vl",
    "AVX512IFMA": "avx512ifma",
    "AVX512VBMI": "avx512vbmi",
    "AVX512VBMI2": "avx512_vbmi2",
    "AVX512VNNI": "avx512_vnni",
    "AVX512BITALG": "avx512_bitalg",
    "AVX512VPOPCNTDQ": "avx512_vpopcntdq",
    "AVX512BF16": "avx512_bf16",
    "AVX512FP16": "avx512_fp16",
    "GFNI": "gfni",
    "VAES": "vaes",
    "VPCLMULQDQ": "vpclmulqdq",
    "EM64T": "lm",
    "LAHF": "lahf_lm",
    "LZCNT": "abm",
    "AMXTILE": "amx_tile",
    "AMXINT8": "amx_int8",
    "AMXBF16": "amx_bf16",
}


# py-cpuinfo's CPUID flag names -> linux names, for the features it decodes (leaves 1, 7.0 and
# 0x80000001; it reads neither leaf 7.1 nor XCR0, so avx512_bf16, avx_vnni and AMX are not
# among them). Names not listed are spelled as Linux spells them.
PYCPUINFO_NAMES: Final[dict[str, str]] = {
    "avx512vnni": "avx512_vnni",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "rdrnd": "rdrand",
    "sha": "sha_ni",
    "tscdeadline": "tsc_deadline_timer",
}
# The reported features py-cpuinfo's CPUID decoding can see at all.
PYCPUINFO_SEES: Final = frozenset(REPORTED) - {"avx512_bf16", "avx512_fp16", "avx_vnni"} - AMX_FAMILY


def known_flag_names() -> frozenset[str]:
    """Every flag name ktforge understands (used to mend flag words cut by line wrapping)."""
    names = {name for bits in CPUID_BITS.values() for name in bits.values()}
    names.update(SYSCTL_WORDS.values())
    return frozenset(names)


# Compiler predefined macros -> feature names: what a binary compiled with given flags may
# execute (the C++ side is generated from this: see cpp_header).
COMPILER_MACROS: Final[dict[str, str]] = {
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl",
    "__AVX512DQ__": "avx512dq",
    "__AVX512CD__": "avx512cd",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16",
    "__AVXVNNI__": "avx_vnni",
    "__AMX_TILE__": "amx_tile",
    "__AMX_INT8__": "amx_int8",
    "__AMX_BF16__": "amx_bf16",
    "__AMX_FP16__": "amx_fp16",
}

_REGISTERS: Final = {"eax": 0, "ebx": 1, "ecx": 2, "edx": 3}


def cpp_header() -> str:
    """The C++ side of these tables (native/src/runtime, native/src/arch): CPUID bits, the OS
    state each feature needs, and the compiler macros. Generated at configure time by
    ``python -m ktforge.detect.features cpp OUTPUT``; nothing in C++ repeats them by hand."""
    bits = [
        f'    {{"{name}", {{{leaf:#x}, {subleaf}, {_REGISTERS[register]}, {bit}}}}},'
        for (leaf, subleaf, register), entries in CPUID_BITS.items()
        for bit, name in sorted(entries.items())
    ]
    families = [
        f'  if (feature == "{name}") return OsState::{state};'
        for state, family in (("amx", AMX_FAMILY), ("avx512", AVX512_FAMILY), ("avx", AVX_FAMILY))
        for name in sorted(family)
    ]
    macros = [f'#ifdef {macro}\n    "{name}",\n#endif' for macro, name in COMPILER_MACROS.items()]
    return "\n".join(
        [
            "// Generated by `python -m ktforge.detect.features cpp` from installer/ktforge/detect/features.py.",
            "#pragma once",
            "",
            "#include <map>",
            "#include <string>",
            "#include <vector>",
            "",
            "namespace kt::generated {",
            "",
            "struct CpuidBit {",
            "  unsigned leaf, subleaf, reg, bit;  // reg: 0 eax, 1 ebx, 2 ecx, 3 edx",
            "};",
            "",
            "// Linux flag name -> CPUID bit.",
            "inline const std::map<std::string, CpuidBit>& cpuid_bits() {",
            "  static const std::map<std::string, CpuidBit> table = {",
            *bits,
            "  };",
            "  return table;",
            "}",
            "",
            "enum class OsState { none, avx, avx512, amx };",
            "",
            "// The XCR0 state a feature needs before it may execute.",
            "inline OsState os_state_of(const std::string& feature) {",
            *families,
            "  return OsState::none;",
            "}",
            "",
            "}  // namespace kt::generated",
            "",
            "namespace kt {",
            "",
            "// The features the including translation unit is compiled for, from the compiler's",
            "// predefined macros, null-terminated. Data, not code: reading a kernel table's list runs",
            "// none of that table's instructions, so any CPU may read it. static: each TU its own copy.",
            "static const char* const kCompiledFeatures[] = {",
            *macros,
            "    nullptr,",
            "};",
            "",
            "static inline std::vector<std::string> compiled_features() {",
            "  std::vector<std::string> f;",
            "  for (const char* const* name = kCompiledFeatures; *name; ++name) f.emplace_back(*name);",
            "  return f;",
            "}",
            "",
            "}  // namespace kt",
            "",
        ]
    )


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) != 3 or sys.argv[1] != "cpp":
        sys.exit("usage: python -m ktforge.detect.features cpp OUTPUT")
    target = Path(sys.argv[2])
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists() or target.read_text() != cpp_header():  # unchanged: builds stay incremental
        target.write_text(cpp_header())
