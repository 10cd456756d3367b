"""GGUF files a careful user or an attacker could hand over, refused as llama.cpp's own reader
(gguf_init_from_file_impl) refuses them, or more strictly, each with the file and what is wrong:
files written by gguf-py (the fixtures, and copies made here with its GGUFWriter), then altered
byte by byte where the writer would not write the fault itself."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

import ktforge
from ktforge.checkpoints.gguf import GgufCheckpoint, GgufError
from ktforge.checkpoints.gguf_file import GgufModel

from .test_gguf_checkpoints import FIXTURES, fixture


def tensor_entry(data: bytes, name: str) -> int:
    """Where the directory entry of tensor ``name`` continues after its name: n_dims (u32)."""
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded)


def offset_field(data: bytes, name: str) -> int:
    """Where the u64 data offset of tensor ``name`` is."""
    at = tensor_entry(data, name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims + 4


def patched(tmp_path: Path, change: str) -> Path:
    data = bytearray(fixture("Q4_K").read_bytes())
    gate, up, down = (f"blk.0.ffn_{p}_exps.weight" for p in ("gate", "up", "down"))
    if change == "overlap":  # up's bytes said to be gate's
        data[offset_field(data, up) : offset_field(data, up) + 8] = data[
            offset_field(data, gate) : offset_field(data, gate) + 8
        ]
    elif change == "misaligned":
        (offset,) = struct.unpack_from("<Q", data, offset_field(data, up))
        struct.pack_into("<Q", data, offset_field(data, up), offset + 1)
    elif change == "duplicate tensor":  # "down" and "gate" have one length: down renamed gate
        at = tensor_entry(data, down) - len(down)
        data[at : at + len(down)] = gate.encode()
    elif change == "wrapping dimensions":  # experts 2^62: the product wraps int64 in C
        struct.pack_into("<Q", data, tensor_entry(data, gate) + 4 + 16, 2**62)
    elif change == "five dimensions":
        struct.pack_into("<I", data, tensor_entry(data, gate), 5)
    path = tmp_path / f"{change.replace(' ', '-')}.gguf"
    path.write_bytes(bytes(data))
    return path


STRUCTURE = {
    "overlap": r"tensor 'blk\.0\.ffn_up_exps\.weight' is at data offset \d+, expected \d+",
    "misaligned": r"tensor 'blk\.0\.ffn_up_exps\.weight' is at data offset \d+, expected \d+",
    "duplicate tensor": r"tensor 'blk\.0\.ffn_gate_exps\.weight' appears twice",
    "wrapping dimensions": r"hold more than 2\^62 values",
    "five dimensions": r"has 5 dimensions; GGUF allows 4",
}


@pytest.mark.parametrize("change", sorted(STRUCTURE))
def test_a_directory_llama_cpp_would_refuse_is_refused(change: str, tmp_path: Path) -> None:
    with pytest.raises(GgufError, match=STRUCTURE[change]):
        ktforge.MoE.from_pretrained(patched(tmp_path, change), 0)


def written(path: Path, keys: dict[str, tuple[str, object]], parts: int = 1) -> Path:
    """The Q4_K fixture's tensors and sizes under gguf-py's writer, with metadata ``keys`` (name:
    (add_* method, value)) besides; ``parts`` > 1: split into that many files by the writer."""
    source = gguf.GGUFReader(fixture("Q4_K"))
    split = -(-len(source.tensors) // parts) if parts > 1 else 0
    writer = gguf.GGUFWriter(str(path), "qwen3moe", split_max_tensors=split)
    for field in source.fields.values():
        if field.types and field.types[0] == gguf.GGUFValueType.UINT32 and field.name.startswith("qwen3moe."):
            writer.add_uint32(field.name, int(field.parts[-1][0]))
    for name, (method, value) in keys.items():
        getattr(writer, method)(name, value)
    for t in source.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("method", "value"), [("add_int32", -32), ("add_uint32", 0), ("add_uint32", 24), ("add_string", "32")]
)
def test_an_alignment_that_is_no_power_of_two_is_refused(method: str, value: object, tmp_path: Path) -> None:
    path = written(tmp_path / "a.gguf", {"general.alignment": (method, value)})
    with pytest.raises(GgufError, match=rf"general\.alignment is '?{value}'?, not a power of two"):
        GgufCheckpoint(path)


def test_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path / "k.gguf", {"test.aaaa": ("add_uint32", 1), "test.aaab": ("add_uint32", 2)})
    data = bytearray(path.read_bytes())
    at = data.index(b"test.aaab")
    data[at : at + 9] = b"test.aaaa"
    path.write_bytes(bytes(data))
    with pytest.raises(GgufError, match=r"metadata key 'test\.aaaa' appears twice"):
        GgufCheckpoint(path)


def test_a_file_cut_short_while_it_is_read_is_an_error_not_a_signal(tmp_path: Path) -> None:
    """Read through the descriptor: a memory map's page past the new end would be SIGBUS."""
    path = tmp_path / "m.gguf"
    shutil.copy(fixture("Q4_K"), path)
    with GgufCheckpoint(path) as checkpoint:
        os.truncate(path, path.stat().st_size // 2)
        with pytest.raises(GgufError, match=r"m\.gguf: tensor blk\.0\.ffn_\w+_exps\.weight is cut short at byte"):
            for projection in ("gate", "up", "down"):
                checkpoint.quantized(0, projection)


def split_copy(tmp_path: Path, parts: int) -> list[Path]:
    """The Q4_K fixture split by gguf-py's writer into ``parts`` files (a directory of their own)."""
    folder = tmp_path / f"split{parts}"
    folder.mkdir()
    written(folder / "m.gguf", {}, parts)
    found = sorted(folder.glob("*.gguf"))
    assert len(found) == parts
    return found


def test_split_parts_must_agree_with_their_names_and_each_other(tmp_path: Path) -> None:
    two, three = split_copy(tmp_path, 2), split_copy(tmp_path, 3)
    GgufModel(two[0]).close()  # as written: fine
    shutil.copy(three[1], two[1])  # part 2 of a 3-part split in place of part 2 of 2
    with pytest.raises(
        GgufError, match=r"m-00002-of-00002\.gguf: split\.no, split\.count are \(1, 3\); as part 2 of 2"
    ):
        GgufModel(two[0])
    for name in ("m-00003-of-00002.gguf", "m-00001-of-00000.gguf"):
        shutil.copy(three[0], tmp_path / name)
        with pytest.raises(GgufError, match=r"is not a part a split model can have"):
            GgufModel(tmp_path / name)


def test_a_part_linked_from_outside_the_directory_is_refused(tmp_path: Path) -> None:
    first, second = split_copy(tmp_path, 2)
    outside = tmp_path / "elsewhere.gguf"
    second.rename(outside)
    second.symlink_to(outside)
    with pytest.raises(GgufError, match=r"split part: 'm-00002-of-00002\.gguf' is a link to a file outside"):
        GgufModel(first)


def test_a_tensor_in_two_parts_is_refused(tmp_path: Path) -> None:
    first, second = split_copy(tmp_path, 2)
    names = [t.name for t in gguf.GGUFReader(first).tensors]
    other, taken = next(
        (o.name, n) for o in gguf.GGUFReader(second).tensors for n in names if len(o.name) == len(n)
    )  # a name of part 2 renamed to one of part 1 of the same length
    data = bytearray(second.read_bytes())
    at = tensor_entry(data, other) - len(other)
    data[at : at + len(other)] = taken.encode()
    second.write_bytes(bytes(data))
    with pytest.raises(GgufError, match=rf"tensor '{taken}' is also in m-00001-of-00002\.gguf"):
        GgufModel(first)


def test_a_directory_with_a_checkpoint_and_a_gguf_says_so(tmp_path: Path) -> None:
    shutil.copy(fixture("Q4_K"), tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe"}')
    with pytest.raises(GgufError, match=r"holds a checkpoint \('config\.json'\) and GGUF files"):
        ktforge.MoE.from_pretrained(tmp_path, 0)
    assert (FIXTURES / "split").is_dir()


def test_a_split_of_many_parts_with_the_others_missing_is_one_short_line(tmp_path: Path) -> None:
    first = tmp_path / "m-00001-of-99999.gguf"
    shutil.copy(fixture("Q4_K"), first)
    with pytest.raises(GgufError) as refused:
        GgufModel(first)
    message = str(refused.value)
    assert "part 1 of a split model of 99999 parts; 99998 of them are missing" in message
    assert "m-00002-of-99999.gguf" in message and "and 99995 more" in message
    assert len(message) < 300 + len(str(first)) and "\n" not in message


def with_extra_tensor(path: Path, raw_type: gguf.GGMLQuantizationType, values: int) -> Path:
    """The Q4_K fixture's tensors and metadata, and an attention tensor ``blk.0.attn_q.weight`` of
    16 rows of ``values`` in ``raw_type`` (arbitrary bytes: only its size matters), written by gguf-py."""
    source = gguf.GGUFReader(fixture("Q4_K"))
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    for field in source.fields.values():
        if field.types and field.types[0] == gguf.GGUFValueType.UINT32 and field.name.startswith("qwen3moe."):
            writer.add_uint32(field.name, int(field.parts[-1][0]))
    for t in source.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[raw_type]
    raw = np.random.default_rng(0).integers(0, 255, (16, values // block_values * block_bytes), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def retyped(path: Path, name: str, type_id: int, first_dim: int | None = None) -> Path:
    """``path`` with tensor ``name``'s ggml type id (and its first dimension, ne[0]) rewritten."""
    data = bytearray(path.read_bytes())
    at = tensor_entry(data, name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    if first_dim is not None:
        struct.pack_into("<Q", data, at + 4, first_dim)
    path.write_bytes(bytes(data))
    return path


# a type ktforge does not compute, in a tensor outside the experts: (written as, ggml id, ne[0] then)
OUTSIDE_THE_EXPERTS = {
    "NVFP4": (gguf.GGMLQuantizationType.NVFP4, 40, None),
    "Q1_0": (gguf.GGMLQuantizationType.Q1_0, 41, None),
    "Q2_0": (gguf.GGMLQuantizationType.Q4_0, 42, 512),  # Q4_0's 8 blocks of 18 bytes a row are Q2_0's 8
    "Q4_0_4_4": (gguf.GGMLQuantizationType.Q8_0, 31, None),  # removed from ggml: its size unknown
    "type id 139": (gguf.GGMLQuantizationType.Q8_0, 139, None),  # not ggml's (a fork's)
}


@pytest.mark.parametrize("kind", sorted(OUTSIDE_THE_EXPERTS))
def test_a_type_outside_the_experts_does_not_sink_the_file(kind: str, tmp_path: Path) -> None:
    raw_type, type_id, first_dim = OUTSIDE_THE_EXPERTS[kind]
    path = retyped(with_extra_tensor(tmp_path / "x.gguf", raw_type, 256), "blk.0.attn_q.weight", type_id, first_dim)
    with GgufModel(path) as model:
        info = model.tensors["blk.0.attn_q.weight"]
        assert info.type.name == kind
        written = 16 * 256 // gguf.GGML_QUANT_SIZES[raw_type][0] * gguf.GGML_QUANT_SIZES[raw_type][1]
        if info.type.sized:  # ggml's size of it: the bytes the writer wrote
            assert model.data(info.name).nbytes == info.nbytes == written
        else:  # skipped, never read
            with pytest.raises(GgufError, match=rf"attn_q\.weight is {kind}, which cannot be read"):
                model.data(info.name)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    ids = np.array([[0, 1], [2, 3], [1, 2]], dtype=np.int32)
    w = np.full((3, 2), 0.5, dtype=np.float32)
    alone = ktforge.MoE.from_pretrained(fixture("Q4_K"), 0, backend="reference").forward(x, ids, w)
    beside = ktforge.MoE.from_pretrained(path, 0, backend="reference").forward(x, ids, w)
    assert np.array_equal(alone, beside)


@pytest.mark.parametrize(
    ("type_id", "why"),
    [
        (139, r"is type id 139, which ktforge does not compute: it is not one of ggml's types \(ids 0-42\)"),
        (31, r"is Q4_0_4_4, which ktforge does not compute: removed from ggml"),
    ],
)
def test_an_expert_tensor_of_a_type_ktforge_cannot_read_is_named(type_id: int, why: str, tmp_path: Path) -> None:
    path = tmp_path / "e.gguf"
    shutil.copy(fixture("Q4_K"), path)
    retyped(path, "blk.0.ffn_up_exps.weight", type_id)
    with pytest.raises(GgufError, match=r"blk\.0\.ffn_up_exps\.weight " + why) as refused:
        ktforge.MoE.from_pretrained(path, 0)
    assert "\n" not in str(refused.value)
