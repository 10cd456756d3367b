"""MoE.from_pretrained on GPTQ and AWQ checkpoints in their own layouts (``qweight``, ``qzeros``,
``scales``, GPTQ's ``g_idx``), packed by AutoGPTQ and AutoAWQ: served as stored in int4z (float32
scales, a zero point a group) against a float64 MoE over each tool's own dequantization.

int4z's kernels take int8 activations, quantized per token: against the float64 layer with the
activations so quantized the bound is 1e-4 (``int8_layer_error`` forgives 1 token in 50 whose
intermediate value rounds to the next int8 step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge.checkpoints.checkpoint import Checkpoint

from .. import host
from ..gptq_awq_checkpoints import write_gptq_awq_checkpoint
from ..moe_reference import float_reference, int8_activations_reference, int8_layer_error, rel_err, routing

BOUND = 1e-4
PROJECTIONS = ("gate", "up", "down")


def _inputs(T: int, E: int, k: int, H: int) -> tuple[Any, Any, Any]:
    ids, w = routing(T, E, k, seed=T)
    return np.random.default_rng(T).standard_normal((T, H)).astype(np.float32), ids, w


@pytest.mark.parametrize("method", ["gptq", "awq"])
@pytest.mark.parametrize(("arch", "group"), [("qwen3_moe", 128), ("mixtral", 32)])
def test_the_tools_checkpoint_runs_on_its_own_values(tmp_path: Path, method: str, arch: str, group: int) -> None:
    E, k, H, I = 4, 2, 256, 128
    dense = write_gptq_awq_checkpoint(tmp_path, method, arch, group=group, E=E, k=k, H=H, I=I)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "int4z" and moe._group == group
    for T in (1, 3, 40):
        x, ids, w = _inputs(T, E, k, H)
        y = moe.forward(x, ids, w)
        assert int8_layer_error(y, int8_activations_reference(x, ids, w, *dense.values())) < BOUND, T
    with Checkpoint(tmp_path) as checkpoint:
        file_bytes = sum(checkpoint.source_bytes(1, e, p) for e in range(E) for p in PROJECTIONS)
    # a float32 scale and a byte of zero point a group against float16 and half a byte (and g_idx)
    assert moe.info["packed_bytes"] / file_bytes < (1.15 if group == 32 else 1.05)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_every_backend_serves_them(tmp_path: Path, method: str) -> None:
    E, k, H, I = 3, 2, 256, 128
    dense = write_gptq_awq_checkpoint(tmp_path, method, group=32, E=E, k=k, H=H, I=I)
    for backend in host.runnable_backends():
        moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend=backend)
        for T in (2, 70):  # 70 tokens: > 32 an expert, the AMX tile kernels' path
            x, ids, w = _inputs(T, E, k, H)
            got = moe.forward(x, ids, w)
            assert int8_layer_error(got, int8_activations_reference(x, ids, w, *dense.values())) < BOUND, (backend, T)


def test_act_order_is_refused_and_another_method_requantizes(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    E, k, H, I, T = 2, 1, 256, 128, 5
    dense = write_gptq_awq_checkpoint(tmp_path, "gptq", group=32, E=E, k=k, H=H, I=I)
    x, ids, w = _inputs(T, E, k, H)
    int8g = ktforge.MoE.from_pretrained(tmp_path, layer=1, method="int8g", group_size=32)
    assert rel_err(int8g.forward(x, ids, w), float_reference(x, ids, w, *dense.values())) < 3e-2
    tensors = load_file(str(tmp_path / "model.safetensors"))
    name = "model.layers.1.mlp.experts.0.gate_proj.g_idx"
    tensors[name] = tensors[name][torch.randperm(H, generator=torch.Generator().manual_seed(0))].contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"gate_proj.qweight' \(gptq\): its g_idx is act-order"):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
