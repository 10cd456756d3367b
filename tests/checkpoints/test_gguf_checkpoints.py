"""GGUF experts as llama.cpp writes them, served from the file's own values.

The fixtures (tests/fixtures/gguf, made by scripts/make_gguf_fixtures.py) are tiny Qwen3-MoE
files written by gguf-py's GGUFWriter and quantized by llama.cpp's own quantizer, one a type, a
mixed-type file and a split copy. Every served type is held to gguf-py's own dequantization
(``gguf.quants.dequantize``): the repacked layout bit for bit, the layer within the rounding of
its activations. Every other type is refused, naming the type and the tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

import ktforge
from ktforge.checkpoints import gguf_file
from ktforge.checkpoints.gguf import GgufCheckpoint, GgufError
from ktforge.formats.quantize import dequantize
from ktforge.resources import data_path

from .. import host
from ..moe_reference import activation_block, bf16_round, blocks_of, int8_activations_reference, int8_layer_error
from .serving import inputs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
E, K_TOP, H, I = 4, 2, 256, 256
SERVED = {
    "BF16": "bf16",
    "F16": "f16",
    "F32": "f32",
    "Q8_0": "q8_0",
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q4_K": "q4_k",
    "Q5_K": "q5_k",
    "Q6_K": "q6_k",
    "MXFP4": "mxfp4",
    "NVFP4": "nvfp4",
    "IQ4_NL": "iq4_nl",
    "IQ4_XS": "iq4_xs",
    "Q3_K": "q3_k",
    "Q2_K": "q2_k",
    "IQ2_XXS": "iq2_xxs",
    "IQ2_XS": "iq2_xs",
    "IQ3_XXS": "iq3_xxs",
    "IQ1_S": "iq1_s",
}
# packed bytes of the experts / the file's bytes of them: the repack's cost
GROWTH = {
    "BF16": 1.0,
    "F16": 1.0,
    "F32": 1.0,
    "Q8_0": 1.0,
    "Q4_0": 1.0,
    "Q4_1": 1.0,
    "Q5_0": 1.0,
    "Q5_1": 1.0,
    "Q4_K": 148 / 144,
    "Q5_K": 180 / 176,
    "Q6_K": 1.0,
    "MXFP4": 1.0,
    "NVFP4": 148 / 144,  # a float32 tensor scale a row (the file's: one an expert, in .scale)
    "IQ4_NL": 1.0,
    "IQ4_XS": 138 / 136,
    "Q3_K": 114 / 110,
    "Q2_K": 1.0,
    "IQ2_XXS": 1.0,
    "IQ2_XS": 1.0,
    "IQ3_XXS": 1.0,
    "IQ1_S": 1.0,
}


def fixture(name: str) -> Path:
    return FIXTURES / f"qwen3moe-{name}.gguf"


def tool_dense(path: Path, layer: int = 0) -> list[np.ndarray[Any, Any]]:
    """gate, up, down as gguf-py dequantizes the file's tensors, float64, each expert times its
    ``.scale`` where the file has one (NVFP4's tensor scale, which llama.cpp multiplies the expert's
    output by)."""
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    dense = []
    for p in ("gate", "up", "down"):
        t = tensors[f"blk.{layer}.ffn_{p}_exps.weight"]
        values = gguf_dequantize(t.data, t.tensor_type).astype(np.float32)
        scale = tensors.get(f"blk.{layer}.ffn_{p}_exps.scale")
        if scale is not None:
            values = values * np.asarray(scale.data, np.float32)[:, None, None]
        dense.append(values.astype(np.float64))
    return dense


def bf16_activations_reference(
    x: Any, ids: Any, w: Any, gate: Any, up: Any, down: Any, taken: Any = bf16_round
) -> np.ndarray[Any, Any]:
    """The layer in float64 with each projection's input rounded to bfloat16, as bf16 kernels take it
    (``taken``: as another format's kernels take it)."""
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        xt = taken(x[t]).astype(np.float64)
        for j in range(ids.shape[1]):
            e = ids[t, j]
            g, u = gate[e] @ xt, up[e] @ xt
            a = taken((g / (1 + np.exp(-g)) * u).astype(np.float32)).astype(np.float64)
            out[t] += w[t, j] * (down[e] @ a)
    return out


# ids gguf-py 0.19 does not name: those ggml removed (ggml.h keeps them as comments), and Q2_0,
# which ggml.h gained after gguf-py 0.19 (llama.cpp's ggml-common.h: 64 values, a float16 and 16 bytes)
REMOVED_FROM_GGML = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8"}
REMOVED_FROM_GGML |= {36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}
NEWER_THAN_GGUF_PY = {42: ("Q2_0", (64, 18))}


def test_the_type_table_is_ggmls() -> None:
    # every id of ggml's enum, with ids and block sizes as gguf-py (llama.cpp's own Python package) states them
    rows = json.loads(data_path("gguf_types.json").read_text())["types"]
    assert [row["id"] for row in rows] == list(range(len(rows)))
    known = {kind.value for kind in gguf.GGMLQuantizationType}
    assert known | set(REMOVED_FROM_GGML) | set(NEWER_THAN_GGUF_PY) == set(range(len(rows)))
    for row in rows:
        if row["id"] in REMOVED_FROM_GGML:
            assert (row["name"], row["block"], row["served_as"]) == (REMOVED_FROM_GGML[row["id"]], None, None)
            continue
        if row["id"] in NEWER_THAN_GGUF_PY:
            assert (row["name"], tuple(row["block"])) == NEWER_THAN_GGUF_PY[row["id"]]
            continue
        kind = gguf.GGMLQuantizationType[row["name"]]
        assert kind.value == row["id"] and tuple(gguf.GGML_QUANT_SIZES[kind]) == tuple(row["block"]), row["name"]
        assert row["served_as"] is None or row["served_as"] in ktforge.formats.names()


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.gguf")), ids=lambda p: p.name)
def test_the_reader_agrees_with_gguf_py(path: Path) -> None:
    reader = gguf.GGUFReader(path)
    ours = gguf_file.GgufFile(path)
    try:
        assert set(ours.tensors) == {t.name for t in reader.tensors}
        for t in reader.tensors:
            info = ours.tensors[t.name]
            assert info.type.id == t.tensor_type.value and info.shape == tuple(reversed(t.shape.tolist()))
            assert np.array_equal(ours.data(info).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
        for field in reader.fields.values():
            if not field.name.startswith("GGUF."):
                value = field.contents()
                assert ours.metadata[field.name] == (pytest.approx(value) if isinstance(value, float) else value)
    finally:
        ours.close()


@pytest.mark.parametrize("name", SERVED)
def test_each_served_type_is_the_files_values_bit_for_bit(name: str) -> None:
    with GgufCheckpoint(fixture(name)) as checkpoint:
        method = checkpoint.stored_formats(0)["gate"][0]
        assert method == SERVED[name]
        for projection, dense in zip(("gate", "up", "down"), tool_dense(fixture(name)), strict=True):
            q = checkpoint.quantized(0, projection)
            ours = dequantize(q, method, dense.shape[-1]).astype(np.float64)
            assert np.array_equal(ours, dense), projection


@pytest.mark.parametrize("backend", host.tested_backends())
@pytest.mark.parametrize("name", SERVED)
def test_each_served_type_runs_within_the_rounding_of_its_activations(name: str, backend: str) -> None:
    moe = ktforge.MoE.from_pretrained(fixture(name), 0, backend=backend)
    assert moe.method == SERVED[name] and (moe.num_experts, moe.top_k, moe.hidden_size) == (E, K_TOP, H)
    dense = tool_dense(fixture(name))
    # decode, and > 32 tokens an expert (the AMX tile path; those of groups of 16 start at 64)
    for T in (2, 70, 140) if name in ("Q6_K", "Q3_K", "Q2_K") else (2, 70):
        x, ids, w = inputs(T, E, K_TOP, H)
        y = moe.forward(x, ids, w)
        if name in ("BF16", "F16", "F32"):  # bf16's activations rounded to bf16; the others' exact
            taken = bf16_round if name == "BF16" else (lambda a: a)
            reference = bf16_activations_reference(x, ids, w, *dense, taken=taken)
            assert np.abs(y - reference).max() / np.abs(reference).max() < 1e-5, (backend, T)
        else:
            assert int8_layer_error(y, int8_activations_reference(x, ids, w, *dense, block=blocks_of(moe))) < 1e-4, (
                backend,
                T,
            )


@pytest.mark.parametrize("name", SERVED)
def test_the_packed_experts_take_the_files_bytes_or_at_most_the_repacks_growth(name: str) -> None:
    moe = ktforge.MoE.from_pretrained(fixture(name), 0, backend="reference")
    with GgufCheckpoint(fixture(name)) as checkpoint:
        ratio = moe.info["packed_bytes"] / checkpoint.source_bytes(0)
    assert ratio == pytest.approx(GROWTH[name], rel=1e-9)


@pytest.mark.parametrize("name", ["IQ2_S", "IQ3_S", "IQ1_M", "TQ2_0"])
def test_a_type_without_a_kernel_is_refused_naming_the_type_and_tensor(name: str, tmp_path: Path) -> None:
    # the F32 file with its gate experts relabelled as a lattice (or ternary) type by gguf-py's
    # GGUFWriter, bytes of that type's size: refused before any is read
    kind = gguf.GGMLQuantizationType[name]
    values, size = gguf.GGML_QUANT_SIZES[kind]
    base = gguf.GGUFReader(fixture("F32"))
    writer = gguf.GGUFWriter(str(tmp_path / "lattice.gguf"), "qwen3moe")
    for field in base.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            kinds = field.types
            writer.add_key_value(field.name, field.contents(), kinds[0], sub_type=kinds[-1] if len(kinds) > 1 else None)
    for t in base.tensors:
        if t.name == "blk.0.ffn_gate_exps.weight":
            shape = tuple(reversed(t.shape.tolist()))
            data = np.zeros((*shape[:-1], shape[-1] // values * size), np.uint8)
            writer.add_tensor(t.name, data, raw_dtype=kind)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufError, match=rf"blk\.0\.ffn_gate_exps\.weight is {name}, which ktforge does not compute: "):
        ktforge.MoE.from_pretrained(tmp_path / "lattice.gguf", 0)


def activations_reference(x: Any, ids: Any, w: Any, dense: list[Any], blocks: tuple[int | None, int | None]) -> Any:
    """The layer in float64 over ``dense`` with each projection's input as its kernels take it:
    int8 with a scale per ``blocks`` values of K (gate/up's, down's) or, where None, rounded to
    bfloat16."""
    from ..moe_reference import dequantize_blocks

    def taken(a: Any, block: int | None) -> Any:
        if block is None:
            return bf16_round(np.asarray(a, np.float32)).astype(np.float64)
        return dequantize_blocks(np.asarray(a, np.float32)[None], block)[0]

    gate, up, down = dense
    out = np.zeros((x.shape[0], down.shape[1]))
    for t in range(x.shape[0]):
        xt = taken(x[t], blocks[0])
        for j in range(ids.shape[1]):
            e = ids[t, j]
            g, u = gate[e] @ xt, up[e] @ xt
            a = (g / (1 + np.exp(-g)) * u).astype(np.float32)
            out[t] += w[t, j] * (down[e] @ taken(a, blocks[1]))
    return out


MIXED = {
    "mixed": ("q4_k", "q8_0"),
    "mixed-bf16": ("q4_k", "bf16"),
    "mixed-q6k": ("q4_k", "q6_k"),
    "mixed-q5k": ("q5_k", "q6_k"),
    # Unsloth's dynamic quants, as llama.cpp's quantizer makes them with an importance matrix (the
    # attention and the rest Q4_K/Q6_K): UD-Q2_K_XL's experts, and UD-IQ1_S's
    "mixed-ud-q2_k_xl": ("iq2_xs", "iq3_xxs"),
    "mixed-ud-iq1_s": ("iq1_s", "iq2_xxs"),
}


@pytest.mark.parametrize("backend", host.tested_backends())
@pytest.mark.parametrize("name", MIXED)
def test_a_layer_whose_down_has_its_own_type_runs_each_in_its_format(name: str, backend: str) -> None:
    # gate and up Q4_K, down Q8_0, BF16 or Q6_K (Q4_K_M's); Q5_K and Q6_K (Q5_K_M's): as llama.cpp's
    # _M mixes and Unsloth's UD files give them
    method, down = MIXED[name]
    moe = ktforge.MoE.from_pretrained(fixture(name), 0, backend=backend)
    assert (moe.method, moe.down_method) == (method, down) and moe.info["down_method"] == down
    dense = tool_dense(fixture(name))
    with GgufCheckpoint(fixture(name)) as checkpoint:
        for projection, values in zip(("gate", "up", "down"), dense, strict=True):
            served = checkpoint.stored_formats(0)[projection][0]
            ours = dequantize(checkpoint.quantized(0, projection), served, values.shape[-1])
            assert np.array_equal(ours.astype(np.float64), values), projection
        infos = [checkpoint.model.tensors[checkpoint.tensor_name(0, p)] for p in ("gate", "up", "down")]
        assert moe.info["packed_bytes"] == pytest.approx(sum(i.nbytes * GROWTH[i.type.name] for i in infos))
    for T in (2, 70):
        x, ids, w = inputs(T, E, K_TOP, H)
        blocks = (
            activation_block(method, 32, H),
            None if down == "bf16" else activation_block(down, 32, moe.intermediate_size),
        )
        reference = activations_reference(x, ids, w, dense, blocks)
        y = moe.forward(x, ids, w)
        assert int8_layer_error(y, reference) < 1e-4, (backend, T)


def test_gate_and_up_of_different_formats_are_refused_naming_each() -> None:
    with pytest.raises(GgufError, match=r"gate and up need different formats \(gate Q4_K, up Q4_0, down Q4_K"):
        ktforge.MoE.from_pretrained(fixture("mixed-gate-up"), 0)


def test_split_files_and_a_directory_load_as_the_whole_file(tmp_path: Path) -> None:
    x, ids, w = inputs(9, E, K_TOP, H)
    whole = ktforge.MoE.from_pretrained(fixture("Q4_K"), 0, backend="reference").forward(x, ids, w)
    parts = sorted((FIXTURES / "split").glob("*.gguf"))
    assert [p.name for p in parts] == ["qwen3moe-Q4_K-00001-of-00002.gguf", "qwen3moe-Q4_K-00002-of-00002.gguf"]
    for path in (parts[0], parts[1], FIXTURES / "split"):
        got = ktforge.MoE.from_pretrained(path, 0, backend="reference").forward(x, ids, w)
        assert np.array_equal(got, whole), path
    shutil.copy(parts[0], tmp_path / parts[0].name)
    with pytest.raises(
        GgufError, match=r"part 1 of a split model of 2 parts; 1 of them are missing \(.*00002-of-00002\.gguf\)"
    ):
        ktforge.MoE.from_pretrained(tmp_path / parts[0].name, 0)
    shutil.copy(fixture("BF16"), tmp_path)
    with pytest.raises(GgufError, match="holds 2 GGUF models"):
        ktforge.MoE.from_pretrained(tmp_path, 0)


def test_broken_files_are_clear_errors(tmp_path: Path) -> None:
    data = fixture("Q4_K").read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(GgufError, match="not a GGUF file"):
        ktforge.MoE.from_pretrained(tmp_path / "magic.gguf", 0)
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(GgufError, match="runs past the end of the file"):
        ktforge.MoE.from_pretrained(tmp_path / "cut.gguf", 0)
    (tmp_path / "header.gguf").write_bytes(data[:300])
    with pytest.raises(GgufError, match=r"truncated|runs past"):
        ktforge.MoE.from_pretrained(tmp_path / "header.gguf", 0)
    with pytest.raises(GgufError, match="layer 3 holds no routed experts"):
        ktforge.MoE.from_pretrained(fixture("Q4_K"), 3)
    with pytest.raises(ValueError, match="served as q4_k, in the file's values"):
        ktforge.MoE.from_pretrained(fixture("Q4_K"), 0, method="int4")
