"""KTFORGE_DISABLE_CPU_FEATURES: one machine acting as a lower one, everywhere ktforge reads the CPU.

Each case runs in a fresh process with the variable set, as a user (or CI) runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from ktforge.builder import backends
from ktforge.detect import mask

from .. import host

PROBE = r"""
import json, ktforge, ktforge._native as native
from ktforge.builder.assessment import assess
from ktforge.detect import evidence
info = ktforge.build_info()
report = assess(evidence.collect_live(with_blis=False))
layer = ktforge.MoE(4, 2, 64, 64, method="int8")
refused = {}
for b in info["backends"]:
    try:
        ktforge.MoE(4, 2, 64, 64, method="int8", backend=b["name"])
    except ValueError as exc:
        refused[b["name"]] = str(exc)
print(json.dumps({
    "selection": info["selection"], "backends": info["backends"], "refused": refused,
    "usable": report["cpu"]["usable_features"], "disabled": report["cpu"]["disabled_features"],
    "layer": layer.info, "cpu_has": {f: native.cpu_has(f) for f in sorted(mask.MASKABLE)},
}))
""".replace("mask.MASKABLE", repr(sorted(mask.MASKABLE)))


def masked(value: str) -> dict[str, Any]:
    env = {**os.environ, mask.VARIABLE: value}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_unknown_names_are_an_error_naming_the_known_ones() -> None:
    assert mask.parse(" AVX2, amx_tile avx512_bf16 ") == {"avx2", "amx_tile", "avx512_bf16"}
    assert mask.parse("") == frozenset()
    with pytest.raises(mask.MaskError, match=r"'avx513'.*known: .*avx512_bf16"):
        mask.parse("avx2,avx513")
    with pytest.raises(mask.MaskError, match="'sse2'"):  # a real flag, but no kernel path depends on it
        mask.parse("sse2")
    # and importing the kernels with one fails with that message, before any kernel is chosen
    env = {**os.environ, mask.VARIABLE: "avx513"}
    done = subprocess.run(
        [sys.executable, "-c", "import ktforge; ktforge.MoE"], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "'avx513'" in done.stderr and "MaskError" in done.stderr


def test_hiding_avx2_leaves_the_reference_everywhere_ktforge_reads_the_cpu() -> None:
    got = masked("avx2")
    assert got["disabled"] == ["avx2"] and "avx2" not in got["usable"]
    assert got["selection"]["auto"] == "reference" and got["selection"]["disabled_cpu_features"] == ["avx2"]
    assert got["layer"]["name"] == "reference" and got["layer"]["disabled_cpu_features"] == ["avx2"]
    assert got["cpu_has"]["avx2"] is False
    for b in got["backends"]:  # a backend needing a hidden feature neither runs nor is taken by name
        if "avx2" in b["required_cpu_features"]:
            assert not b["runs_here"]
            assert "avx2 (disabled by KTFORGE_DISABLE_CPU_FEATURES)" in got["refused"][b["name"]]
    # the rest of the CPU is as it was: the mask takes away only what it names
    whole = masked("")
    assert set(whole["usable"]) - set(got["usable"]) == {"avx2"} & set(whole["usable"])
    assert {f for f, v in whole["cpu_has"].items() if v} - {f for f, v in got["cpu_has"].items() if v} <= {"avx2"}


def test_each_lower_kind_of_host_runs_its_own_level_or_a_lower_one() -> None:
    """Under each lower kind's mask 'auto' runs a level that needs no hidden feature: the kind's own
    where this build compiles it at its exact flags (a host build's -march=native AVX-512 backend
    has every feature of this CPU, so it gives way to AVX2), never one above it."""
    order = [name for name, _ in backends.host_kinds()]
    usable = host.usable_features() | host.disabled_features()
    kinds = [(n, sorted(hidden & usable)) for n, hidden in backends.host_kinds()]
    for name, hidden in kinds:
        if name != backends.ALWAYS and not backends.by_name(name).features <= usable:
            continue  # above this machine
        got = masked(",".join(hidden))
        auto = got["selection"]["auto"]
        required = next(b["required_cpu_features"] for b in got["backends"] if b["name"] == auto)
        assert not set(required) & set(hidden), (name, auto)
        assert order.index(auto) >= order.index(name), (name, auto)
        exact = [b for b in got["backends"] if b["name"] == name and not set(b["required_cpu_features"]) & set(hidden)]
        if exact:
            assert auto == name


def test_a_mask_never_adds_what_the_cpu_lacks() -> None:
    absent = sorted(mask.MASKABLE - host.usable_features())
    if not absent:
        pytest.skip("this CPU has every maskable feature")  # then nothing is absent to check
    got = masked(absent[0])
    whole = masked("")
    assert got["selection"]["auto"] == whole["selection"]["auto"] and got["usable"] == whole["usable"]
    for name, text in got["refused"].items():  # refused as lacking, not as disabled
        assert "disabled by" not in text, (name, text)


def mask_finding(environ: dict[str, str]) -> dict[str, Any]:
    """kt doctor's cpu.mask finding, run in ``environ``."""
    command = [sys.executable, "-m", "ktforge", "doctor", "--json", "--check", "cpu.mask"]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)
    findings: list[dict[str, Any]] = [c for c in json.loads(done.stdout)["checks"] if c["id"] == "cpu.mask"]
    [finding] = findings
    return finding


def test_the_doctor_says_a_mask_is_in_force() -> None:
    finding = mask_finding({**os.environ, mask.VARIABLE: "avx2"})
    assert finding["status"] == "warn" and "avx2 disabled" in finding["finding"]
    assert "unset KTFORGE_DISABLE_CPU_FEATURES" in finding["commands"]
    assert mask_finding({k: v for k, v in os.environ.items() if k != mask.VARIABLE})["status"] == "ok"


@pytest.mark.parametrize("hidden", ["avx2", "avx512f", ""])
def test_aocl_is_capped_to_what_the_mask_leaves(hidden: str) -> None:
    # AOCL-BLAS picks its own code path from CPUID: under a mask it is told the level left
    # (AOCL_ENABLE_INSTRUCTIONS, which AOCL reads when it initialises, at its first call)
    script = (
        "import ctypes, ktforge._native\n"
        "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
        "print((libc.getenv(b'AOCL_ENABLE_INSTRUCTIONS') or b'').decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AOCL_ENABLE_INSTRUCTIONS"} | {mask.VARIABLE: hidden}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    has = hidden in host.usable_features()
    expected = {"avx2": "GENERIC", "avx512f": "AVX2"}.get(hidden, "") if has else ""
    assert done.stdout.strip() == expected
    # a value the user chose is kept
    env["AOCL_ENABLE_INSTRUCTIONS"] = "zen3"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "zen3"
