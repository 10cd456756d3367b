"""The weight-format table: what Python reads of it and what the compiled extension was
generated from agree; bad rows and bad groups are refused by name."""

from __future__ import annotations

import pytest

import ktforge
from ktforge import formats
from ktforge.builder import backends


def test_the_extension_was_generated_from_the_table() -> None:
    computed_by_kernels = [f.name for f in formats.table() if formats.KERNELS in f.providers]
    for backend in ktforge.build_info()["backends"]:
        assert list(backend["kernels"]) == computed_by_kernels, backend["name"]
    assert f"enum class Method {{ {', '.join(formats.names())} }};" in formats.cpp_text()


@pytest.mark.parametrize("name", formats.names())
def test_every_format_of_the_table_builds_a_layer(name: str) -> None:
    f = formats.by_name(name)
    moe = ktforge.MoE(4, 2, 64, 48, method=name, group_size=f.group_sizes[0] if f.grouped else 128)
    assert moe.info["method"] == name and moe.info["kernel"]


def test_bytes_per_weight_count_the_scales() -> None:
    assert formats.by_name("bf16").bytes_per_weight() == 2.0
    assert formats.by_name("int8").bytes_per_weight() == 1.0  # one scale a row: nothing a weight
    assert formats.by_name("int4").bytes_per_weight(32) == 0.5 + 4 / 32
    assert formats.by_name("int4").bytes_per_weight(128) == 0.5 + 4 / 128


def test_unknown_formats_and_groups_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="method must be one of bf16, int8, int4, got 'fp8'"):
        ktforge.MoE(4, 2, 64, 48, method="fp8")
    with pytest.raises(ValueError, match="group_size must be 32, 64 or 128, got 48"):
        formats.check_group("int4", 48)
    formats.check_group("int8", 48)  # ungrouped: any


def test_a_row_of_an_unknown_element_is_refused() -> None:
    row = {
        "name": "fp6",
        "element": "fp6",
        "bits": 6,
        "k_step": 64,
        "group_sizes": [],
        "scale": None,
        "zero_point": None,
        "activations": "",
        "providers": {"kernels": ""},
        "checkpoint": {"weight_dtype": "U8", "scale_dtype": None, "names": []},
    }
    with pytest.raises(ValueError, match="element 'fp6' is none of bf16, int8, int4"):
        formats._format(row)


def test_library_backends_compute_what_the_table_says() -> None:
    [blis] = [lib for lib in backends.libraries() if lib.name == "amd-blis"]
    assert blis.methods == tuple(f.name for f in formats.table() if "aocl" in f.providers) == ("bf16", "int8")
