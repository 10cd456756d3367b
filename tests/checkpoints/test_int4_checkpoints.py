"""MoE.from_pretrained on INT4 checkpoints written by compressed-tensors (``pack-quantized``): the
file's codes and scales served as they are (method "int4" at the file's group size), against a
float64 MoE over the library's own dequantization.

int4's kernels take int8 activations, quantized per token: against the float64 layer with the
activations so quantized the bound is 1e-4 (fp32 sums; ``int8_layer_error`` forgives 1 token in
50 whose intermediate value rounds to the next int8 step); against exact activations it is what that
rounding costs (3e-2 on these random layers, 1.2-1.6e-2 measured).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

import ktforge
from ktforge.checkpoints.checkpoint import Checkpoint
from ktforge.formats.quantize import quantize

from .. import host
from ..int4_checkpoints import write_int4_checkpoint
from ..moe_reference import blocks_of, float_reference, int8_activations_reference, int8_layer_error, rel_err
from .serving import assert_every_backend_serves, inputs

BOUND = 1e-4  # fp32 sums against float64 over the same weights and int8 activations
ACTIVATION_ROUNDING = 3e-2  # int8 activations per token, against exact ones
PROJECTIONS = ("gate", "up", "down")


@pytest.mark.parametrize(("arch", "group"), [("qwen3_moe", 32), ("deepseek_v3", 128), ("mixtral", 64)])
def test_int4_checkpoint_runs_on_its_own_values(tmp_path: Path, arch: str, group: int) -> None:
    E, k, H, I = 4, 2, 256, 128
    layers = write_int4_checkpoint(tmp_path, arch, group=group, E=E, k=k, H=H, I=I)
    dense = [layers[1][p][0] for p in PROJECTIONS]
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "int4" and moe.info["method"] == "int4"
    for T in (1, 3, 40):
        x, ids, w = inputs(T, E, k, H)
        y = moe.forward(x, ids, w)
        assert int8_layer_error(y, int8_activations_reference(x, ids, w, *dense, block=blocks_of(moe))) < BOUND, T
        assert rel_err(y, float_reference(x, ids, w, *dense)) < ACTIVATION_ROUNDING, T
    # the file's bytes and no more: codes as stored, bf16 scales as stored (the file adds its shapes)
    with Checkpoint(tmp_path) as checkpoint:
        file_bytes = sum(checkpoint.source_bytes(1, e, p) for e in range(E) for p in PROJECTIONS)
    assert 0.98 < moe.info["packed_bytes"] / file_bytes <= 1.0


def test_the_repack_keeps_every_code_and_scale(tmp_path: Path) -> None:
    layers = write_int4_checkpoint(tmp_path, group=32, E=2, H=128, I=64)
    with Checkpoint(tmp_path) as checkpoint:
        for projection in PROJECTIONS:
            stored = checkpoint.expert(1, 1, projection)
            q = quantize(stored, "int4", 32)
            codes = np.stack([q.weight & 0x0F, q.weight >> 4], axis=-1).reshape(q.weight.shape[0], -1)
            assert np.array_equal(codes.astype(np.int64) - 8, layers[1][projection][1][1])
            assert q.scale is not None and q.scale.dtype == ml_dtypes.bfloat16
            assert np.array_equal(stored.to_float32(), layers[1][projection][0][1].astype(np.float32))


def test_every_backend_at_the_decode_and_tile_paths(tmp_path: Path) -> None:
    E, k, H, I = 3, 2, 192, 96
    layers = write_int4_checkpoint(tmp_path, group=32, E=E, k=k, H=H, I=I)
    assert_every_backend_serves(tmp_path, [layers[1][p][0] for p in PROJECTIONS], E, k, H, "int4")


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_channel_strategy_runs_at_any_k(tmp_path: Path, symmetric: bool) -> None:
    """A scale (and zero point) per output row, at K = 192 and 96 (not 128): served with that scale
    in each group of 32 (the largest dividing both), the library's own values."""
    E, k, H, I = 3, 2, 192, 96
    layers = write_int4_checkpoint(tmp_path, group=0, E=E, k=k, H=H, I=I, symmetric=symmetric)
    dense = [layers[1][p][0] for p in PROJECTIONS]
    with Checkpoint(tmp_path) as checkpoint:
        for projection in PROJECTIONS:
            stored = checkpoint.expert(1, 1, projection)
            assert stored.group == 32
            assert np.array_equal(stored.to_float32(), dense[PROJECTIONS.index(projection)][1].astype(np.float32))
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend="reference")
    assert moe.method == ("int4" if symmetric else "int4z") and moe._group == 32
    x, ids, w = inputs(5, E, k, H)
    want = int8_activations_reference(x, ids, w, *dense, block=blocks_of(moe))
    assert int8_layer_error(moe.forward(x, ids, w), want) < 1e-4


@pytest.mark.parametrize(
    ("scale_dtype", "symmetric"), [("float16", True), ("float32", True), ("bfloat16", False), ("float16", False)]
)
def test_what_int4_cannot_hold_runs_as_int4z(tmp_path: Path, scale_dtype: str, symmetric: bool) -> None:
    # float16 / float32 scales (bfloat16 would round them) and zero points (GPTQ sym: false, AWQ,
    # compressed-tensors' asymmetric schemes): int4z's float32 scales and zero points hold them exactly
    E, k, H, I = 3, 2, 128, 64
    layers = write_int4_checkpoint(tmp_path, group=32, E=E, k=k, H=H, I=I, scale_dtype=scale_dtype, symmetric=symmetric)
    dense = [layers[1][p][0] for p in PROJECTIONS]
    with Checkpoint(tmp_path) as checkpoint:  # the library's dequantization, zero points included
        assert checkpoint.stored_method(1) == "int4z"
        for projection in PROJECTIONS:
            stored = checkpoint.expert(1, 2, projection)
            assert (stored.zero is None) == symmetric
            assert np.array_equal(stored.to_float32(), dense[PROJECTIONS.index(projection)][2].astype(np.float32))
    for backend in host.tested_backends():
        moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend=backend)
        assert moe.method == "int4z" and moe._group == 32
        for T in (2, 70):
            x, ids, w = inputs(T, E, k, H)
            assert (
                int8_layer_error(
                    moe.forward(x, ids, w), int8_activations_reference(x, ids, w, *dense, block=blocks_of(moe))
                )
                < BOUND
            ), backend
    with Checkpoint(tmp_path) as checkpoint:
        file_bytes = sum(checkpoint.source_bytes(1, e, p) for e in range(E) for p in PROJECTIONS)
    # float32 scales and a byte a zero point: 5 bytes a group of 32 against the file's 2 or 4 (+ 0.5)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.info["packed_bytes"] / file_bytes < 1.2
    int4 = ktforge.MoE.from_pretrained(tmp_path, layer=1, method="int4", group_size=32)  # asked for: re-quantized
    x, ids, w = inputs(5, E, k, H)
    assert int4.method == "int4" and rel_err(int4.forward(x, ids, w), float_reference(x, ids, w, *dense)) < 0.3


def test_kt_convert_to_int4_copies_the_file_bit_for_bit(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from ktforge.cli import commands as cli

    layers = write_int4_checkpoint(tmp_path / "src", group=64, E=2, H=128, I=64)
    out = tmp_path / "out"
    args = ["convert", "--input", str(tmp_path / "src"), "--output", str(out), "--quant", "int4", "--group-size", "64"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    converted = load_file(str(out / "layer-001.safetensors"))
    for projection in PROJECTIONS:
        weight = converted[f"{projection}.weight"]
        codes = np.stack([weight & 0x0F, weight >> 4], axis=-1).reshape(*weight.shape[:-1], -1)
        assert np.array_equal(codes.astype(np.int64) - 8, layers[1][projection][1])
    assert ktforge.MoE.from_pretrained(out, layer=1).method == "int4"


def test_int4_checkpoint_with_a_scheme_ktforge_cannot_read(tmp_path: Path) -> None:
    import json

    write_int4_checkpoint(tmp_path, group=32, E=2, H=128, I=64)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"pack-quantized weights of 2-bit int; ktforge serves 4-bit int"):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
