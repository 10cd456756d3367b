"""The weight-format table: what Python reads of it and what the compiled extension was
generated from agree; bad rows and bad groups are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import ktforge
from ktforge import formats
from ktforge.builder import backends
from ktforge.formats.quantize import dequantize, quantize

from ..moe_reference import make_layer


def test_the_extension_was_generated_from_the_table() -> None:
    computed_by_kernels = [f.name for f in formats.table() if formats.KERNELS in f.providers]
    for backend in ktforge.build_info()["backends"]:
        # a level this CPU cannot run is not asked to describe itself (that is code of its level)
        expected = computed_by_kernels if backend["runs_here"] else []
        assert list(backend["kernels"]) == expected, backend["name"]
    assert f"enum class Method {{ {', '.join(formats.names())} }};" in formats.cpp_text()


@pytest.mark.parametrize("name", formats.names())
def test_every_format_of_the_table_builds_a_layer(name: str) -> None:
    f = formats.by_name(name)
    moe = ktforge.MoE(4, 2, 64, 48, method=name, group_size=f.group_sizes[0] if f.grouped else 128)
    assert moe.info["method"] == name and moe.info["kernel"]


def test_bytes_per_weight_count_the_scales() -> None:
    assert formats.by_name("bf16").bytes_per_weight() == 2.0
    assert formats.by_name("int8").bytes_per_weight() == 1.0  # one scale a row: nothing a weight
    # 16-bit group scales: group 32 takes Q4_0's 18 bytes per 32 weights
    assert formats.by_name("int4").bytes_per_weight(32) == 0.5 + 2 / 32 == 18 / 32
    assert formats.by_name("int4").bytes_per_weight(128) == 0.5 + 2 / 128
    assert formats.by_name("int8g").bytes_per_weight(32) == 1 + 2 / 32 == 34 / 32  # Q8_0's


@pytest.mark.parametrize("method", ["int4", "int8g"])
@pytest.mark.parametrize("group", [32, 128])
def test_the_packed_layer_takes_the_tables_bytes_per_weight(method: str, group: int) -> None:
    E, H, I = 2, 256, 128  # whole 16-column blocks and groups: no padding
    moe = ktforge.MoE(E, 1, H, I, method=method, group_size=group)
    moe.load_weights(*make_layer(E, H, I))
    expected = 3 * E * H * I * formats.by_name(method).bytes_per_weight(group)  # values and scales, nothing else
    assert moe.info["packed_bytes"] == expected


def rel_rms(back: np.ndarray, w: np.ndarray) -> float:
    """The relative RMS error of dequantized weights."""
    return float(np.sqrt(np.mean((back - w) ** 2) / np.mean(w**2)))


def test_int4_at_group_32_is_llama_cpps_q4_0_in_bytes_and_accuracy() -> None:
    """The same bytes a weight and the same 16-code grid as Q4_0, as gguf-py (llama.cpp's own
    Python package) quantizes and dequantizes it; only the scales' rounding differs (bf16 here,
    fp16 there)."""
    import gguf

    w = np.random.default_rng(4).standard_normal((64, 512)).astype(np.float32)
    ours = quantize(w, "int4", 32)
    q4_0 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    assert q4_0.nbytes / w.size == formats.by_name("int4").bytes_per_weight(32) == 18 / 32

    theirs = rel_rms(gguf.quants.dequantize(q4_0, gguf.GGMLQuantizationType.Q4_0), w)
    assert abs(rel_rms(dequantize(ours, "int4", 512), w) / theirs - 1) < 0.01
    codes = np.stack([ours.weight & 15, ours.weight >> 4], -1).reshape(64, 512)  # q + 8, as Q4_0's
    their_codes = q4_0.reshape(64, 16, 18)[..., 2:]
    their_codes = np.concatenate([their_codes & 15, their_codes >> 4], -1).reshape(64, 512)
    assert (codes == their_codes).mean() > 0.99


def test_int8g_at_group_32_is_llama_cpps_q8_0_in_bytes_and_accuracy() -> None:
    """The same bytes a weight and grid as Q8_0, as gguf-py quantizes and dequantizes it, and
    no less accurate: the scales are bf16 here (fp16 there), each the best of three around
    max|w| / 127 (Q8_0 takes max|w| / 127). Per-row int8 (ktforge's int8) is the less accurate."""
    import gguf

    w = np.random.default_rng(5).standard_normal((64, 512)).astype(np.float32)
    ours = quantize(w, "int8g", 32)
    q8_0 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    assert q8_0.nbytes / w.size == formats.by_name("int8g").bytes_per_weight(32) == 34 / 32

    theirs = rel_rms(gguf.quants.dequantize(q8_0, gguf.GGMLQuantizationType.Q8_0), w)
    assert 0.9 < rel_rms(dequantize(ours, "int8g", 512), w) / theirs < 1.0  # measured: 0.966
    assert rel_rms(dequantize(quantize(w, "int8"), "int8", 512), w) > 1.3 * theirs
    their_codes = q8_0.reshape(64, 16, 34)[..., 2:].view(np.int8).reshape(64, 512).astype(int)
    # a scale up to 0.6% off Q8_0's moves a code by at most 2 of 127
    assert np.abs(ours.weight - their_codes).max() <= 2 and (ours.weight == their_codes).mean() > 0.7


def test_unknown_formats_and_groups_are_refused_by_name() -> None:
    with pytest.raises(
        ValueError,
        match="method must be one of bf16, int8, int8g, int4, fp8, mxfp4, nvfp4, mxfp8, int4z, q8_0, q4_k, q5_k, "
        "iq4_nl, iq4_xs, q6_k, q3_k, q2_k, iq2_xxs, iq2_xs, iq3_xxs, iq1_s, q4_0, q4_1, q5_0, q5_1, f16, f32, "
        "got 'fp6'",
    ):
        ktforge.MoE(4, 2, 64, 48, method="fp6")
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
