"""MoE.from_pretrained on GPTQ and AWQ checkpoints in their own layouts (``qweight``, ``qzeros``,
``scales``, GPTQ's ``g_idx``), packed by AutoGPTQ and AutoAWQ: served as stored in int4z (float32
scales, a zero point a group) against a float64 MoE over each tool's own dequantization.

int4z's kernels take int8 activations, quantized per token: against the float64 layer with the
activations so quantized the bound is 1e-4 (``int8_layer_error`` forgives 1 token in 50 whose
intermediate value rounds to the next int8 step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ktforge
from ktforge.checkpoints.checkpoint import Checkpoint

from .. import host
from ..gptq_awq_checkpoints import write_gptq_awq_checkpoint
from ..moe_reference import float_reference, int8_activations_reference, int8_layer_error, rel_err
from .serving import assert_every_backend_serves, inputs

BOUND = 1e-4
PROJECTIONS = ("gate", "up", "down")


@pytest.mark.parametrize("method", ["gptq", "awq"])
@pytest.mark.parametrize(("arch", "group"), [("qwen3_moe", 128), ("mixtral", 32)])
def test_the_tools_checkpoint_runs_on_its_own_values(tmp_path: Path, method: str, arch: str, group: int) -> None:
    E, k, H, I = 4, 2, 256, 128
    dense = write_gptq_awq_checkpoint(tmp_path, method, arch, group=group, E=E, k=k, H=H, I=I)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "int4z" and moe._group == group
    for T in (1, 3, 40):
        x, ids, w = inputs(T, E, k, H)
        y = moe.forward(x, ids, w)
        assert int8_layer_error(y, int8_activations_reference(x, ids, w, *dense.values(), block=group)) < BOUND, T
    with Checkpoint(tmp_path) as checkpoint:
        file_bytes = sum(checkpoint.source_bytes(1, e, p) for e in range(E) for p in PROJECTIONS)
    # a float32 scale and a byte of zero point a group against float16 and half a byte (and g_idx)
    assert moe.info["packed_bytes"] / file_bytes < (1.15 if group == 32 else 1.05)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_every_backend_serves_them(tmp_path: Path, method: str) -> None:
    E, k, H, I = 3, 2, 256, 128
    dense = write_gptq_awq_checkpoint(tmp_path, method, group=32, E=E, k=k, H=H, I=I)
    assert_every_backend_serves(tmp_path, list(dense.values()), E, k, H, "int4z")


@pytest.mark.parametrize("group", [32, 128])
def test_act_order_runs_exactly_on_every_backend(tmp_path: Path, group: int) -> None:
    # desc_act: each input in the group of its rank; gate and up share one order (one input)
    E, k, H, I = 3, 2, 256, 128
    dense = write_gptq_awq_checkpoint(tmp_path, "gptq", group=group, E=E, k=k, H=H, I=I, desc_act=True)
    with Checkpoint(tmp_path) as checkpoint:
        stored = checkpoint.expert(1, 0, "gate")
        assert stored.order is not None and not np.array_equal(stored.order, np.arange(H))
        assert np.array_equal(stored.to_float32(), dense["gate"][0].astype(np.float32))  # in input order
        # each expert's input orders, gate/up's and down's (x's own where it has none)
        orders = tuple(
            np.stack(
                [
                    checkpoint.expert(1, e, p).order if checkpoint.expert(1, e, p).order is not None else np.arange(n)
                    for e in range(E)
                ]
            )
            for p, n in (("gate", H), ("down", I))
        )
    for backend in host.tested_backends():
        moe = ktforge.MoE.from_pretrained(tmp_path, layer=1, backend=backend)
        assert moe.method == "int4z"
        for T in (2, 70):
            x, ids, w = inputs(T, E, k, H)
            got = moe.forward(x, ids, w)
            want = int8_activations_reference(x, ids, w, *dense.values(), block=group, orders=orders)
            assert int8_layer_error(got, want) < BOUND, (backend, T)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    moe.load_input_order()  # x's own order: no longer the layer the file holds
    x, ids, w = inputs(9, E, k, H)
    assert rel_err(moe.forward(x, ids, w), int8_activations_reference(x, ids, w, *dense.values(), block=group)) > 0.1
    nan = x.copy()
    nan[4, 7] = np.nan
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    with pytest.raises(ValueError, match=r"x contains NaN or infinite values \(row 4\)"):
        moe.forward(nan, ids, w)


def test_act_orders_that_cannot_be_served_are_refused(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    E, k, H, I, T = 2, 1, 256, 128, 5
    dense = write_gptq_awq_checkpoint(tmp_path, "gptq", group=32, E=E, k=k, H=H, I=I, desc_act=True)
    x, ids, w = inputs(T, E, k, H)
    original = load_file(str(tmp_path / "model.safetensors"))
    up = "model.layers.1.mlp.experts.0.up_proj.g_idx"
    tensors = dict(original)
    tensors[up] = tensors[up][torch.randperm(H, generator=torch.Generator().manual_seed(1))].contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"expert 0: gate's and up's act-orders \(g_idx\) differ"):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    tensors[up] = torch.zeros(H, dtype=torch.int32)  # every input in group 0
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"up_proj.qweight' \(gptq\): its g_idx does not put 32 inputs in each of 8"):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    tensors[up] = torch.arange(H, dtype=torch.int32) // 32 - 1  # group -1: numpy's bincount refused it in its words
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"up_proj.qweight' \(gptq\): its g_idx is not 256 group numbers in 0\.\.7"):
        ktforge.MoE.from_pretrained(tmp_path, layer=1)
    save_file(original, str(tmp_path / "model.safetensors"))
    int8g = ktforge.MoE.from_pretrained(tmp_path, layer=1, method="int8g", group_size=32)  # re-quantized
    assert rel_err(int8g.forward(x, ids, w), float_reference(x, ids, w, *dense.values())) < 3e-2


def test_input_orders_are_checked() -> None:
    moe = ktforge.MoE(2, 1, 8, 16, method="int4z", group_size=32)
    with pytest.raises(ValueError, match=r"order must be integers of shape \(2, 8\)"):
        moe.load_input_order(np.zeros((2, 7), np.int64))
    order = np.tile(np.arange(8), (2, 1))
    order[1, 3] = 2
    with pytest.raises(ValueError, match=r"order\[1\] is not a permutation of range\(8\)"):
        moe.load_input_order(order)

    with pytest.raises(ValueError, match=r"order\[0\] is not a permutation"):  # the extension checks too
        moe._layer.load_input_order(np.full((2, 8), 9, np.int32))


@pytest.mark.parametrize(
    ("method", "act_order", "symmetric"), [("gptq", True, False), ("gptq", False, True), ("awq", False, False)]
)
def test_linear_layers_dequantize_to_the_tools_own_values(method: str, act_order: bool, symmetric: bool) -> None:
    # what an engine does with a layer it has no kernel for; a tensor-parallel rank's half of an
    # act-order layer's inputs (row parallel) takes its g_idx's half and every group's scales
    import torch

    from ktforge.checkpoints import gptq_awq

    from ..gptq_awq_checkpoints import act_order as act_order_g_idx
    from ..gptq_awq_checkpoints import awq, gptq

    N, K, group = 64, 256, 32
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(3))
    if method == "awq":
        tensors, expected = awq(w, group)
    else:
        g_idx = act_order_g_idx(K, group, seed=5) if act_order else None
        tensors, expected = gptq(w, group, g_idx, symmetric=symmetric)
    arrays = {f".{name}": value.numpy() for name, value in tensors.items()}
    scheme = gptq_awq.Scheme(method, group, 1 if method == "gptq" else 0)
    assert np.array_equal(gptq_awq.dense(scheme, arrays, N, K), expected.astype(np.float32))
    if method == "gptq":
        half = dict(
            arrays,
            **{gptq_awq.QWEIGHT: arrays[gptq_awq.QWEIGHT][K // 16 :], gptq_awq.G_IDX: arrays[gptq_awq.G_IDX][K // 2 :]},
        )
        assert np.array_equal(gptq_awq.dense(scheme, half, N, K // 2), expected[:, K // 2 :].astype(np.float32))
        wrong = dict(arrays, **{gptq_awq.G_IDX: np.full(K, K // group, np.int32)})
        with pytest.raises(ValueError, match=r"its g_idx names groups outside 0\.\.7"):
            gptq_awq.dense(scheme, wrong, N, K)


def test_a_ranks_share_of_an_act_order_layer_is_regrouped_exactly() -> None:
    # tensor parallel splits down's inputs in halves: each half holds parts of every group, which
    # the rank makes whole groups of 32 again, each padded with weights of exactly 0
    import torch

    from ktforge.checkpoints import gptq_awq

    from ..gptq_awq_checkpoints import act_order as act_order_g_idx
    from ..gptq_awq_checkpoints import gptq

    N, K, group = 64, 512, 128
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(7))
    g_idx = act_order_g_idx(K, group, seed=11)
    tensors, expected = gptq(w, group, g_idx)
    arrays = {f".{name}": value.numpy() for name, value in tensors.items()}
    scheme = gptq_awq.Scheme("gptq", group, 1)
    halves = [slice(0, K // 2), slice(K // 2, K)]
    counts = np.stack([gptq_awq.group_counts(arrays[gptq_awq.G_IDX][h], K // group) for h in halves])
    assert (counts.sum(axis=0) == group).all() and (counts % 32 != 0).any()  # groups split unevenly
    sub, length = gptq_awq.regrouped_size(counts, (32, 64, 128))
    assert sub == 32 and K // 2 < length == max(int((-(-c // 32) * 32).sum()) for c in counts)
    for rank, h in enumerate(halves):
        share = dict(arrays, **{gptq_awq.QWEIGHT: arrays[gptq_awq.QWEIGHT][h.start // 8 : h.stop // 8]})
        share[gptq_awq.G_IDX] = arrays[gptq_awq.G_IDX][h]
        codes, scale, zero, order = gptq_awq.unpack_regrouped(scheme, share, N, K // 2, sub, length)
        assert sorted(order[order >= 0].tolist()) == list(range(K // 2))  # every input once
        q = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(N, length).astype(np.float64)
        values = (q - np.repeat(zero, sub, axis=1)) * np.repeat(scale, sub, axis=1)
        assert not values[:, order < 0].any(), f"rank {rank}: padding weighs something"
        assert np.array_equal(values[:, order >= 0], expected[:, h][:, order[order >= 0]]), f"rank {rank}"
        # a group of 32 never mixes two of the file's groups
        column_groups = np.where(order >= 0, share[gptq_awq.G_IDX][np.maximum(order, 0)], -1).reshape(-1, sub)
        assert all(len(set(row[row >= 0].tolist())) <= 1 for row in column_groups)
    with pytest.raises(ValueError, match=r"its inputs need \d+ columns in groups of 32; the layer has 256"):
        gptq_awq.unpack_regrouped(scheme, share, N, K // 2, sub, K // 2)
