"""NVFP4 releases served as stored (method "nvfp4"): compressed-tensors' ``nvfp4-pack-quantized``,
NVIDIA ModelOpt's layout (``quant_algo: NVFP4``) and GGUF's NVFP4 (type 40, with its per-expert
``.scale`` tensor), each against its defining library's dequantization: compressed-tensors' (which
also reads ModelOpt's layout, through its own converter) and gguf-py's.

The values are the file's: ModelOpt's ``e2m1 * weight_scale * weight_scale_2`` exactly up to one
float32 rounding, compressed-tensors' ``weight_scale / weight_global_scale`` (which ktforge applies
as a multiply by ``1 / weight_global_scale``) within one float32 step, gguf-py's bit for bit. The
layer is within the rounding of its int8 activations (1e-4) on every backend this CPU runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ktforge
from ktforge.checkpoints import convert
from ktforge.checkpoints.checkpoint import Checkpoint, CheckpointError
from ktforge.checkpoints.gguf import GgufError

from ..moe_reference import float_reference, rel_err
from ..nvfp4_checkpoints import write_ct_nvfp4_checkpoint, write_modelopt_nvfp4_checkpoint
from .serving import assert_every_backend_serves, inputs
from .test_gguf_checkpoints import fixture

PROJECTIONS = ("gate", "up", "down")
WRITERS = {"compressed-tensors": write_ct_nvfp4_checkpoint, "modelopt": write_modelopt_nvfp4_checkpoint}


def _file_bytes(path: Path, layer: int, experts: int) -> int:
    with Checkpoint(path) as checkpoint:
        return sum(checkpoint.source_bytes(layer, e, p) for e in range(experts) for p in PROJECTIONS)


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_the_readers_values_are_the_librarys(layout: str, tmp_path: Path) -> None:
    E, H, I = 4, 256, 128
    dense = WRITERS[layout](tmp_path, E=E, H=H, I=I)
    with Checkpoint(tmp_path) as checkpoint:
        assert checkpoint.stored_method(1) == "nvfp4"
        for projection in PROJECTIONS:
            for e in range(E):
                ours = checkpoint.expert(1, e, projection).to_float32()  # type: ignore[union-attr]
                theirs = dense[projection][e].astype(np.float32)
                # one float32 step at most: the library divides by its global scale, ktforge multiplies
                assert (np.abs(ours - theirs) <= np.spacing(np.abs(theirs))).all(), (projection, e)
                assert (ours == theirs).mean() > 0.5


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_every_backend_serves_the_release_at_its_own_size(layout: str, tmp_path: Path) -> None:
    E, k, H, I = 3, 2, 192, 96
    dense = WRITERS[layout](tmp_path, E=E, k=k, H=H, I=I)
    assert_every_backend_serves(tmp_path, list(dense.values()), E, k, H, "nvfp4")
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    # the file's codes and UE4M3 scales, and a float32 tensor scale a row (the file: one a tensor)
    rows = E * (2 * I + H)
    file_bytes = _file_bytes(tmp_path, 1, E)
    assert moe.info["packed_bytes"] == file_bytes - E * 3 * 4 + 4 * rows
    x, ids, w = inputs(9, E, k, H)
    assert rel_err(moe.forward(x, ids, w), float_reference(x, ids, w, *dense.values())) < 0.01


def test_kt_convert_keeps_the_files_values_and_another_method_requantizes(tmp_path: Path) -> None:
    E, k, H, I = 4, 2, 128, 64
    write_modelopt_nvfp4_checkpoint(tmp_path / "release", E=E, k=k, H=H, I=I)
    direct = ktforge.MoE.from_pretrained(tmp_path / "release", layer=1)
    with convert.plan(tmp_path / "release", tmp_path / "out", "nvfp4", 16, "auto", None) as planned:
        convert.run(planned, 2, lambda *_: None)
    converted = ktforge.MoE.from_pretrained(tmp_path / "out", layer=1)
    int4 = ktforge.MoE.from_pretrained(tmp_path / "release", layer=1, method="int4", group_size=32)
    for T in (1, 20):
        x, ids, w = inputs(T, E, k, H)
        assert np.array_equal(converted.forward(x, ids, w), direct.forward(x, ids, w))
        assert rel_err(int4.forward(x, ids, w), direct.forward(x, ids, w)) < 0.3


def _rewrite(path: Path, name: str, change: Any) -> None:
    """The checkpoint's one shard with tensor ``name`` replaced by ``change(tensor)`` (None: removed)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    changed = change(tensors[name])
    if changed is None:
        del tensors[name]
    else:
        tensors[name] = changed
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("tensor", "change", "message"),
    [
        ("weight_scale", lambda t: (t.view(torch.uint8) | 0x80).view(t.dtype), "negative scales"),
        ("weight_scale", lambda t: (t.view(torch.uint8) | 0x7F).view(t.dtype), "holds NaN"),
        ("weight_scale_2", lambda t: t * 0, "weight_scale_2 must be one finite positive value"),
        ("weight_scale_2", lambda t: None, r"weight_scale_2' \(the tensor scale of .*\) is missing"),
        ("weight", lambda t: t[:, :-1].contiguous(), r"NVFP4 of \[64, 128\] is uint8 \[64, 64\]"),
    ],
)
def test_a_broken_release_is_one_line_naming_the_tensor(tensor: str, change: Any, message: str, tmp_path: Path) -> None:
    write_modelopt_nvfp4_checkpoint(tmp_path, E=2, k=1, H=128, I=64)
    name = f"model.layers.1.mlp.experts.1.up_proj.{tensor}"
    _rewrite(tmp_path, name, change)
    with pytest.raises(CheckpointError, match=message) as refused:
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert "\n" not in str(refused.value) and "up_proj" in str(refused.value)


def _gguf_with(tmp_path: Path, base: str, name: str, values: Any) -> Path:
    """A copy of fixture ``base`` with tensor ``name`` (F32) set to ``values``, or added."""
    import gguf

    reader = gguf.GGUFReader(fixture(base))
    out = tmp_path / f"{base}.gguf"
    writer = gguf.GGUFWriter(str(out), "qwen3moe")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            kind = field.types[0]
            writer.add_key_value(field.name, field.contents(), kind, sub_type=field.types[-1] if kind == 9 else None)
    for t in reader.tensors:
        if t.name != name:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.add_tensor(name, np.asarray(values, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_gguf_expert_scales_are_nvfp4s_or_refused(tmp_path: Path) -> None:
    scale = "blk.0.ffn_up_exps.scale"
    with pytest.raises(GgufError, match=rf"{scale} is not 4 finite F32 values \(one an expert\)"):
        ktforge.MoE.from_pretrained(_gguf_with(tmp_path, "NVFP4", scale, [1.0, 2.0, np.nan, 1.0]), 0)
    with pytest.raises(GgufError, match=rf"{scale} is not 4 finite F32 values"):
        ktforge.MoE.from_pretrained(_gguf_with(tmp_path, "NVFP4", scale, [1.0, 2.0]), 0)
    # llama.cpp scales any expert's output by it; ktforge only NVFP4's, and says so
    with pytest.raises(GgufError, match=rf"{scale} scales the outputs of Q4_K experts; .* NVFP4 experts only"):
        ktforge.MoE.from_pretrained(_gguf_with(tmp_path, "Q4_K", scale, [1.0, 2.0, 1.0, 1.0]), 0)
    ones = ktforge.MoE.from_pretrained(_gguf_with(tmp_path, "Q4_K", scale, np.ones(4)), 0, backend="reference")
    x, ids, w = inputs(3, 4, 2, 256)
    plain = ktforge.MoE.from_pretrained(fixture("Q4_K"), 0, backend="reference")
    assert np.array_equal(ones.forward(x, ids, w), plain.forward(x, ids, w))


def test_a_nan_scale_code_in_a_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nan.gguf"
    shutil.copy(fixture("NVFP4"), path)
    data = bytearray(path.read_bytes())
    import gguf

    reader = gguf.GGUFReader(fixture("NVFP4"))
    gate = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    data[int(gate.data_offset) + 1] = 0xFF  # block 0's second UE4M3 byte: ggml reads 480, past UE4M3's range
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"gate\.scale holds values that are not UE4M3 codes up to 126"):
        ktforge.MoE.from_pretrained(path, 0)
