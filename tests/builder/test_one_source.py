"""One source of truth: the backend table (data/backends.json), the recipes and the CPU
feature table are what every copy is generated from or checked against. An edit that skips
a copy fails here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import ktforge
from ktforge import remedies
from ktforge.builder import backends, recipes
from ktforge.builder.planner import RECIPE_CHOICES
from ktforge.cli import commands as cli
from ktforge.detect import features
from ktforge.detect.report_types import BlisSection
from ktforge.resources import data_path

from .. import host

ROOT = Path(__file__).resolve().parents[2]
RECIPES = [r.name for r in recipes.load_recipes()]


def test_every_recipe_compiles_backends_of_the_table_with_what_they_need() -> None:
    known = {b.name for b in backends.table()}
    for recipe in recipes.load_recipes():
        assert set(recipe.backends) <= known, recipe.name
        for name in recipe.backends:
            assert set(backends.by_name(name).needs) <= set(recipe.backends), recipe.name


def test_the_schema_cli_and_install_sh_name_the_recipes() -> None:
    schema = json.loads(data_path("doctor.schema.json").read_text())
    enum = schema["$defs"]["RecipeChoice"]["properties"]["recommended"]["enum"]
    assert enum == [*RECIPES, "none", "unknown"]
    top = schema["properties"]["recommended_recipe"]
    assert top.get("enum", enum) == enum
    assert ("auto", *RECIPES) == RECIPE_CHOICES
    usage = (ROOT / "install.sh").read_text()
    assert f"--recipe {'|'.join(RECIPE_CHOICES)} " in usage
    help_text = " ".join(CliRunner().invoke(cli.app, ["build", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert f"auto, or a recipe: {', '.join(RECIPES)} (--backend: its old name)." in help_text


def test_the_extension_lists_its_backends_in_the_table_s_order() -> None:
    compiled = [b["name"] for b in ktforge.build_info()["backends"]]
    assert compiled[-1] == backends.ALWAYS
    assert compiled[:-1] == [n for n in backends.names() if n in compiled[:-1]]
    assert set(compiled) <= set(backends.names())
    # and the names ktforge.MoE accepts are the table's
    from ktforge.kernels.moe import BACKENDS

    assert ("auto", *backends.names(), *(lib.name for lib in backends.libraries())) == BACKENDS
    # a library backend names a SIMD backend of the table (or auto) and a recipe of its name
    for lib in backends.libraries():
        assert lib.kernels == "auto" or lib.kernels in backends.names()
        assert lib.name in RECIPES


def test_the_extension_reads_cpuid_as_the_probes_decode_it() -> None:
    # cpu_has (C++, generated from features.CPUID_BITS and the OS-state families) agrees with
    # the probes' Python decoding on every feature of the table
    import ktforge._native as native

    usable = host.usable_features()
    names = sorted({n for bits in features.CPUID_BITS.values() for n in bits.values()} - {"hypervisor", "osxsave"})
    disagree = [n for n in names if native.cpu_has(n) != (n in usable)]
    assert disagree == []


def test_generated_code_is_refused_for_an_unknown_backend(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ktforge.builder.backends", "registry", str(tmp_path / "r.hpp"), "avx2;avx1024"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown backend(s) avx1024" in done.stderr
    assert not (tmp_path / "r.hpp").exists()


def test_no_hand_kept_copy_of_the_tables_in_the_native_sources() -> None:
    native = ROOT / "native" / "src"
    text = "\n".join(p.read_text() for p in native.rglob("*.[ch]pp"))
    assert not re.search(r'\{"avx512f", \{7, 0', text)  # CPUID bits come from features.py
    assert 'emplace_back("avx512_vnni")' not in text  # compiler macros too
    assert '"amd-blis"' not in text  # library backends come from the table
    assert "extern const KernelTable avx2_kernels" not in text  # the registry is generated


def test_every_gate_has_its_remedy() -> None:
    blis: BlisSection = {"searched": [], "libraries": [], "selected": None, "selected_library_dir": None}
    facts = recipes.RecipeFacts(
        system="Darwin",
        arch="aarch64",
        vendor="Other",
        features=frozenset(),
        os_state={"avx": False, "avx512": False, "amx": False},
        amx_permitted=False,
        amx_execution="failed",
        amx_explanation="no",
        blis=blis,
    )
    gates = {g["gate"] for r in recipes.load_recipes() for g in recipes.evaluate(r, facts)["gates"]}
    assert gates and gates <= set(remedies.table())
    assert all(r.text for r in remedies.table().values())
