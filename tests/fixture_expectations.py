"""The backend each recorded machine (tests/fixtures/cpuinfo) should get, by the recipes:
AMX needs AMX+AVX-512 (Sapphire Rapids), avx512 needs F/BW/VL/DQ, avx2 needs AVX2+FMA+F16C,
everything needs Linux on x86-64; text dumps carry no BLIS evidence, so amd-blis is never
recommended from one. Shared by the doctor and the planner tests."""

from __future__ import annotations

NON_X86 = [
    "bgq-rhel6-power7",
    "darwin-bigsur-m1",
    "darwin-monterey-m1",
    "darwin-monterey-m2",
    "darwin-sequoia-m3",
    "darwin-sequoia-m4",
    "linux-amazon-cortex_a72",
    "linux-amazon-neoverse_n1",
    "linux-amazon-neoverse_v1",
    "linux-asahi-m1",
    "linux-asahi-m2",
    "linux-centos7-power8le",
    "linux-centos7-thunderx2",
    "linux-debian13-x60",
    "linux-rhel8-neoverse_v1",
    "linux-rhel8-power9",
    "linux-rhel9-neoverse_n2",
    "linux-rhel9-neoverse_v2",
    "linux-rocky8-a64fx",
    "linux-sifive-u74mc",
    "linux-spacemit-x60",
    "linux-ubuntu22.04-ampere1",
    "linux-ubuntu22.04-ampere1a",
    "linux-ubuntu22.04-neoverse_n2",
    "linux-ubuntu22.04-neoverse_v2",
    "linux-ubuntu24.04-neoverse_v3ae",
    "linux-unknown-neoverse_v2",
    "linux-unknown-power10",
]
EXPECTED: dict[str, str] = dict.fromkeys(NON_X86, "none")
EXPECTED.update(
    {
        # x86 without AVX2 (Sandy/Ivy Bridge, K10, Bulldozer family): nothing to run
        "linux-rhel7-ivybridge": "none",
        "linux-rhel6-piledriver": "none",
        "linux-scientific7-k10": "none",
        "linux-scientific7-piledriver": "none",
        "linux-scientificfermi6-bulldozer": "none",
        "linux-scientificfermi6-piledriver": "none",
        # macOS: the CPU could, the OS cannot
        "darwin-mojave-haswell": "none",
        "darwin-mojave-ivybridge": "none",
        "darwin-mojave-skylake": "none",
        # AVX2 machines
        "linux-rhel7-broadwell": "avx2",
        "linux-rhel7-haswell": "avx2",
        "linux-rhel7-x86_64_v3": "avx2",
        "linux-rhel7-zen": "avx2",
        "linux-ubuntu18.04-broadwell": "avx2",
        "linux-ubuntu20.04-zen3": "avx2",
        "linux-ubuntu24.04-alderlake": "avx2",
        "linux-ubuntu26.04-arrowlake_s": "avx2",
        "windows-cpuid-broadwell": "avx2",
        # AVX-512 machines (no AMX; AMD ones lack BLIS evidence in a dump)
        "linux-centos7-cascadelake": "avx512",
        "linux-rhel7-skylake_avx512": "avx512",
        "linux-rocky8.5-zen4": "avx512",
        "linux-rocky9-zen5": "avx512",
        "windows-cpuid-icelake": "avx512",
        # AMX
        "linux-unknown-sapphirerapids": "amx",
    }
)
