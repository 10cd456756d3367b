"""What the tests may expect of the machine they run on, read from the live report.

The suite runs on whatever CPU it lands on (Sapphire Rapids with AMX, Zen 4 with AVX-512,
Zen 3 with AVX2 only, ...). Nothing here is assumed: the machine report (probes) says what
the CPU and OS allow and which recipe ./install.sh builds, and the installed extension's
build_info() says what it compiled; the tests compare the two.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

import ktforge
from ktforge.builder import backends, recipes
from ktforge.builder.assessment import assess
from ktforge.detect import evidence


@functools.cache
def live_report() -> dict[str, Any]:
    return assess(evidence.collect_live(with_blis=True))


def usable_features() -> frozenset[str]:
    return frozenset(live_report()["cpu"]["usable_features"] or ())


@functools.cache
def unmasked_report() -> dict[str, Any]:
    """The report of the whole machine, KTFORGE_DISABLE_CPU_FEATURES aside: what ./install.sh built for."""
    return assess(dataclasses.replace(evidence.collect_live(with_blis=True), disabled_features=None))


def recommended_recipe() -> recipes.Recipe:
    name = unmasked_report()["recipe"]["recommended"]
    return next(r for r in recipes.load_recipes() if r.name == name)


def recipe_backends() -> set[str]:
    """The kernel backends the recipe ./install.sh builds here compiles (the names the kernels report);
    in a portable build (scripts/masked_tests.py may run on one) every level but the test tools."""
    if portable_build():
        return {b.name for b in backends.table() if b.builds != "test"} | {"reference"}
    return {*recommended_recipe().backends, "reference"}


def portable_build() -> bool:
    return (ktforge.build_info()["record"] or {}).get("recipe") == "portable"


def build_backends() -> list[dict[str, Any]]:
    try:
        return list(ktforge.build_info()["backends"])
    except Exception:  # no extension: the tests that need one fail on their own
        return []


def runnable_backends() -> list[str]:
    """Backends of the installed build that the extension says this CPU runs, best first."""
    return [b["name"] for b in build_backends() if b["runs_here"]]


def tested_backends() -> list[str]:
    """The backends the kernel tests run, best first: every one this CPU runs; under a CPU-feature
    mask (scripts/masked_tests.py, after the full suite ran every backend of the installed build)
    those whose code the mask changes: the level 'auto' now runs unless the full suite ran that
    same code (a portable build's levels are new), and the tile model where its SIMD half is another
    level than without the mask; none where the mask changes neither (every test that runs the
    level 'auto' still runs). The tests that hold backends to the reference backend's output
    compute it themselves."""
    runnable = runnable_backends()
    if not disabled_features():
        return runnable
    whole = set(unmasked_report()["cpu"]["usable_features"] or ())
    before = [b["name"] for b in build_backends() if set(b["required_cpu_features"]) <= whole]
    ran = set() if portable_build() else set(before)
    auto = ktforge.build_info()["selection"]["auto"]
    new = {auto} - ran
    if "amx-model" in runnable and simd_half(runnable) != simd_half(before):
        new.add("amx-model")
    return [b for b in runnable if b in new]


def simd_half(runnable: list[str]) -> str | None:
    """The level the tile backends hand their non-tile work to among ``runnable`` (best first):
    the best SIMD one, as their kernels choose it."""
    return next((b for b in runnable if b not in ("amx", "amx-model", backends.ALWAYS)), None)


def backends_the_report_allows() -> set[str]:
    """Compiled backends whose required CPU features the probes found usable."""
    have = usable_features()
    return {b["name"] for b in build_backends() if set(b["required_cpu_features"]) <= have}


def has(*features: str) -> bool:
    return set(features) <= usable_features()


def disabled_features() -> frozenset[str]:
    """KTFORGE_DISABLE_CPU_FEATURES as the report read it (CI runs the kernel tests under masks)."""
    return frozenset(live_report()["cpu"]["disabled_features"])


def needs_backend(name: str) -> pytest.MarkDecorator:
    """Skip a test that runs backend ``name`` only under a CPU-feature mask (scripts/masked_tests.py)
    that hides it, or whose portable build lacks it (the tile model is a host build's test tool):
    without a mask the same test runs, or fails where the backend cannot run."""
    info = next((b for b in build_backends() if b["name"] == name), None)
    missing = set(info["required_cpu_features"]) - usable_features() if info else set()
    hidden = bool(missing) and missing <= disabled_features()
    reason = (
        f"{name} needs {', '.join(sorted(missing))}, which KTFORGE_DISABLE_CPU_FEATURES disables"
        if info
        else f"{name} is not in this (portable) build, which runs as a lower host under a mask"
    )
    return pytest.mark.skipif(bool(disabled_features()) and (info is None or hidden), reason=reason)


def usable_aocl() -> str | None:
    """The first AOCL-BLAS (with aocl_gemm) that the probes ran a correct GEMM through here:
    what a build that links none finds at run time without KTFORGE_BLIS_LIBRARY."""
    selected: str | None = live_report()["blis"]["selected"]  # the report's first usable library
    return selected


def aocl_gemm_works() -> bool:
    """The BLIS probe found a library whose aocl_gemm add-on computed a correct GEMM here."""
    blis = live_report()["blis"] or {}
    return bool(blis.get("selected"))


AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


def expected_auto_backend(portable: bool = False) -> str:
    """The level backend='auto' should run here, from the report's usable features (written out
    here, not read from the backend table): in a portable wheel every level exists; in the host
    build, the ones its build compiled."""
    amx = has("amx_tile", "amx_int8", "amx_bf16", *AVX512) and live_report()["amx"]["permitted"] is not False
    ladder = [
        ("amx", amx),
        ("avx512-bf16", has(*AVX512, "avx512_vnni", "avx512_bf16")),
        ("avx512-vnni", has(*AVX512, "avx512_vnni")),
        ("avx512", has(*AVX512)),
        ("avx2", has("avx2", "fma", "f16c")),
        ("reference", True),
    ]
    # a host build's levels take -march=native: a mask that hides one of its features stops it
    compiled = None if portable else {b["name"] for b in build_backends() if b["runs_here"]}
    return next(name for name, runs in ladder if runs and (compiled is None or name in compiled))
