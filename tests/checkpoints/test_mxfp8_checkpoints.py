"""MXFP8 releases served as stored (method "mxfp8"): compressed-tensors' ``mxfp8-quantized`` and the
same tensors under ModelOpt's ``quant_algo: MXFP8`` (MiniMax-M3's release's layout: F8_E4M3 weights,
U8 E8M0 scales per 32 columns), against compressed-tensors' own dequantization: the values bit for
bit, the packed experts exactly the file's bytes, the layer within 1e-4 of the float64 one at decode
(exact activations) and 5e-3 on the bf16-dot prefill path, on every backend this CPU runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ktforge
from ktforge.checkpoints import convert
from ktforge.checkpoints.checkpoint import Checkpoint, CheckpointError

from .. import host
from ..moe_reference import float_reference, rel_err
from ..mxfp8_checkpoints import write_ct_mxfp8_checkpoint, write_modelopt_mxfp8_checkpoint
from .serving import inputs
from .test_nvfp4_checkpoints import _file_bytes, _rewrite

WRITERS = {"compressed-tensors": write_ct_mxfp8_checkpoint, "modelopt": write_modelopt_mxfp8_checkpoint}


@pytest.mark.parametrize("layout", sorted(WRITERS))
def test_the_release_is_served_as_it_is(layout: str, tmp_path: Path) -> None:
    E, k, H, I = 4, 2, 256, 96  # down's K, 96: three groups of 32
    dense = WRITERS[layout](tmp_path, E=E, k=k, H=H, I=I)
    with Checkpoint(tmp_path) as checkpoint:
        assert checkpoint.stored_method(1) == "mxfp8"
        for projection, values in dense.items():
            for e in range(E):
                ours = checkpoint.expert(1, e, projection).to_float32()  # type: ignore[union-attr]
                assert np.array_equal(ours.astype(np.float64), values[e]), (projection, e)
    for backend in host.tested_backends():
        moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend=backend)
        assert moe.method == "mxfp8" and moe.info["packed_bytes"] == _file_bytes(tmp_path, 1, E)
        for T in (2, 70):  # decode; > 16 tokens an expert: bf16 dot products where the backend has them
            x, ids, w = inputs(T, E, k, H)
            bound = 5e-3 if T == 70 else 1e-4
            assert rel_err(moe.forward(x, ids, w), float_reference(x, ids, w, *dense.values())) < bound, (backend, T)


def test_kt_convert_keeps_the_files_values(tmp_path: Path) -> None:
    E, k, H, I = 3, 2, 128, 64
    write_ct_mxfp8_checkpoint(tmp_path / "release", E=E, k=k, H=H, I=I)
    with convert.plan(tmp_path / "release", tmp_path / "out", "mxfp8", 32, "auto", None) as planned:
        convert.run(planned, 2, lambda *_: None)
    converted, direct = (ktforge.MoE.from_pretrained(tmp_path / d, layer=1) for d in ("out", "release"))
    for T in (1, 20):
        x, ids, w = inputs(T, E, k, H)
        assert np.array_equal(converted.forward(x, ids, w), direct.forward(x, ids, w))


@pytest.mark.parametrize(
    ("tensor", "change", "message"),
    [
        ("weight_scale", lambda t: torch.full_like(t, 255), "E8M0 code 255: NaN or beyond 2\\^63"),
        ("weight", lambda t: torch.full_like(t.view(torch.uint8), 0x7F).view(t.dtype), "NaN code"),
    ],
)
def test_a_broken_release_is_one_line(tensor: str, change: Any, message: str, tmp_path: Path) -> None:
    write_modelopt_mxfp8_checkpoint(tmp_path, E=2, k=1, H=128, I=64)
    _rewrite(tmp_path, f"model.layers.1.mlp.experts.1.up_proj.{tensor}", change)
    with pytest.raises((CheckpointError, ValueError), match=message) as refused:
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert "\n" not in str(refused.value)
