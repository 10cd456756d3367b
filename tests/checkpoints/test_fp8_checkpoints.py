"""MoE.from_pretrained on FP8 checkpoints written by the real tools: the file's codes and scales
served as they are (method "fp8"), against a float64 MoE over the tool's own dequantization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import ktforge
from ktforge.checkpoints.checkpoint import Checkpoint

from ..fp8_checkpoints import STYLES, write_fp8_checkpoint
from ..kernels.test_fp8 import assert_the_layer
from ..moe_reference import float_reference, rel_err, routing
from ..synthetic_checkpoints import write_checkpoint

BOUND = 1e-4  # fp32 sums and exact fp32 activations against float64 over the same weights


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_fp8_checkpoint_runs_on_its_own_values(tmp_path: Path, style: str, arch: str) -> None:
    E, k, H, I = 4, 2, 384, 256
    dense = write_fp8_checkpoint(tmp_path, style, arch, E=E, k=k, H=H, I=I, moe_layers=(1,))
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "fp8" and moe.info["method"] == "fp8"
    for T in (1, 3, 40):
        ids, w = routing(T, E, k, seed=T)
        x = np.random.default_rng(T).standard_normal((T, H)).astype(np.float32)
        assert_the_layer(moe, x, ids, w, list(dense[1]))
    # no copy beside the file's bytes: the codes, plus 0.2% of scales at these shapes
    with Checkpoint(tmp_path) as checkpoint:
        file_bytes = sum(checkpoint.source_bytes(1, e, p) for e in range(E) for p in ("gate", "up", "down"))
    assert 0.99 < moe.info["packed_bytes"] / file_bytes < 1.01


@pytest.mark.parametrize("style", ["block", "ct-channel"])
def test_odd_shapes_and_every_backend(tmp_path: Path, style: str) -> None:
    # K neither a multiple of 128 nor of 16: partial blocks at both edges
    from .. import host

    E, k, H, I, T = 3, 2, 200, 136, 9
    dense = write_fp8_checkpoint(tmp_path, style, E=E, k=k, H=H, I=I)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(2).standard_normal((T, H)).astype(np.float32)
    for backend in host.tested_backends():
        moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend=backend)
        assert rel_err(moe.forward(x, ids, w), float_reference(x, ids, w, *dense[1])) < BOUND, (
            backend
        )  # under 16 rows an expert: exact activations


def test_another_method_requantizes_the_fp8_values(tmp_path: Path) -> None:
    E, k, H, I, T = 4, 2, 256, 128, 5
    dense = write_fp8_checkpoint(tmp_path, "ct-block", E=E, k=k, H=H, I=I)
    ids, w = routing(T, E, k)
    x = np.random.default_rng(3).standard_normal((T, H)).astype(np.float32)
    reference = float_reference(x, ids, w, *dense[1])
    native = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    int8 = ktforge.MoE.from_pretrained(tmp_path, layer=1, method="int8")
    assert int8.method == "int8" and int8.info["packed_bytes"] < 1.05 * native.info["packed_bytes"]  # + row scales
    assert rel_err(native.forward(x, ids, w), reference) < BOUND < rel_err(int8.forward(x, ids, w), reference) < 5e-2


def test_blocks_that_are_not_fp8_groups_are_refused_with_the_way_out(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "deepseek_v3", dtype="fp8", fp8_block=(16, 16), E=3, H=64, I=40)
    with pytest.raises(ValueError, match=r"FP8 blocks of 16x16 do not hold whole groups of 128.*method="):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert ktforge.MoE.from_pretrained(tmp_path, layer=1, method="int8").method == "int8"


def test_kt_convert_points_fp8_to_from_pretrained(tmp_path: Path) -> None:
    from ktforge.cli import commands as cli

    write_fp8_checkpoint(tmp_path / "src", "block", E=2, H=128, I=128)
    result = CliRunner().invoke(
        cli.app, ["convert", "--input", str(tmp_path / "src"), "--output", str(tmp_path / "out"), "--quant", "fp8"]
    )
    assert result.exit_code != 0
    assert "needs no conversion" in result.output and "from_pretrained" in result.output
    assert not (tmp_path / "out").exists()
