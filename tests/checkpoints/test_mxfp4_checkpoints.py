"""MoE.from_pretrained on MXFP4 checkpoints: compressed-tensors' ``mxfp4-pack-quantized`` (one
tensor an expert) and gpt-oss as OpenAI releases it (fused tensors, gate and up interleaved,
biases, its activation), served as stored (method "mxfp4") against a float64 MoE over each
format's own library's dequantization (compressed-tensors' ``decompress``, transformers'
``convert_moe_packed_tensors``).

mxfp4's kernels take int8 activations, quantized per token: against the float64 layer with the
activations so quantized the bound is 1e-4 (fp32 sums; ``int8_layer_error`` forgives 1 token in
50 whose intermediate value rounds to the next int8 step).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge.checkpoints.checkpoint import Checkpoint

from ..moe_reference import float_reference, int8_activations_reference, int8_layer_error, rel_err
from ..mxfp4_checkpoints import (
    gpt_oss_dense,
    gpt_oss_release,
    write_ct_mxfp4_checkpoint,
    write_deepseek_v4_base,
    write_deepseek_v4_flash,
)
from .serving import assert_every_backend_serves, inputs

BOUND = 1e-4
PROJECTIONS = ("gate", "up", "down")
GPT_OSS_ACTIVATION = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "up_offset": 1.0}


def _file_bytes(path: Path, layer: int, experts: int) -> int:
    with Checkpoint(path) as checkpoint:
        return sum(checkpoint.source_bytes(layer, e, p) for e in range(experts) for p in PROJECTIONS)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_compressed_tensors_mxfp4_runs_on_its_own_values(tmp_path: Path, arch: str) -> None:
    E, k, H, I = 4, 2, 256, 128
    dense = write_ct_mxfp4_checkpoint(tmp_path, arch, E=E, k=k, H=H, I=I)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "mxfp4" and moe.info["method"] == "mxfp4"
    for T in (1, 3, 40):
        x, ids, w = inputs(T, E, k, H)
        assert (
            int8_layer_error(moe.forward(x, ids, w), int8_activations_reference(x, ids, w, *dense.values(), block=32))
            < BOUND
        )
    assert moe.info["packed_bytes"] == _file_bytes(tmp_path, 1, E)  # the file's codes and scales, no more


def test_every_backend_serves_compressed_tensors_mxfp4(tmp_path: Path) -> None:
    E, k, H, I = 3, 2, 192, 96
    dense = write_ct_mxfp4_checkpoint(tmp_path, E=E, k=k, H=H, I=I)
    assert_every_backend_serves(tmp_path, list(dense.values()), E, k, H, "mxfp4")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_gpt_oss_model import saved_gpt_oss

    root = tmp_path_factory.mktemp("gpt-oss")
    saved_gpt_oss(root / "model")
    gpt_oss_release(root / "model", root / "release")
    return root


def _biases(release: Path, layer: int) -> tuple[Any, Any, Any]:
    from safetensors.numpy import load_file

    tensors = load_file(str(release / "model.safetensors"))
    prefix = f"model.layers.{layer}.mlp.experts."
    gate_up = tensors[prefix + "gate_up_proj_bias"].astype(np.float64)
    return gate_up[:, 0::2], gate_up[:, 1::2], tensors[prefix + "down_proj_bias"].astype(np.float64)


@pytest.mark.parametrize("layer", [0, 1])
def test_gpt_oss_release_runs_with_its_activation_and_biases(gpt_oss: Path, layer: int) -> None:
    release = gpt_oss / "release"
    E, k, H = 8, 2, 64
    dense = gpt_oss_dense(release, layer)  # transformers' own dequantization
    moe = ktforge.MoE.from_pretrained(release, layer=layer)
    assert moe.method == "mxfp4" and moe._group == 32
    biases = _biases(release, layer)
    for T in (1, 5, 40):
        x, ids, w = inputs(T, E, k, H)
        want = int8_activations_reference(
            x, ids, w, *dense.values(), block=32, biases=biases, activation=GPT_OSS_ACTIVATION
        )
        assert int8_layer_error(moe.forward(x, ids, w), want) < BOUND, T
        # the plain SwiGLU without biases is something else: the file's gating is what ran
        assert rel_err(int8_activations_reference(x, ids, w, *dense.values(), block=32), want) > 0.05
    assert moe.info["packed_bytes"] == _file_bytes(release, layer, E)


@pytest.mark.parametrize("quant", ["mxfp4", "int8"])
def test_a_conversion_keeps_the_biases_and_the_activation(gpt_oss: Path, quant: str, tmp_path: Path) -> None:
    """gpt-oss's expert biases and clamped SwiGLU (the layer is 54% off without them) and
    DeepSeek-V4's clamp are kept by kt convert: the converted layer computes exactly what the
    checkpoint served as it is does (mxfp4, both releases' format), or its layer quantized for
    the same method (int8)."""
    from ktforge.checkpoints import convert

    write_deepseek_v4_flash(tmp_path / "v4", E=3, k=2, H=64, I=32)
    cases = [(gpt_oss / "release", 8, 2, 64, GPT_OSS_ACTIVATION, True), (tmp_path / "v4", 3, 2, 64, None, False)]
    for source, E, k, H, activation, biases in cases:
        out = tmp_path / f"{source.name}-{quant}"
        with convert.plan(source, out, quant, 32, "auto", None) as planned:
            manifest = convert.run(planned, 2, lambda *_: None)
        assert manifest["biases"] is biases
        assert manifest["activation"] == (activation or {"swiglu_limit": 10.0})
        converted = ktforge.MoE.from_pretrained(out, layer=1)
        # the same method from the checkpoint; mxfp4 is both releases' own format: served as they are
        direct = ktforge.MoE.from_pretrained(source, layer=1, **({} if quant == "mxfp4" else {"method": quant}))
        for T in (1, 9):
            x, ids, w = inputs(T, E, k, H)
            x *= 8  # gate values past the limits
            assert np.array_equal(converted.forward(x, ids, w), direct.forward(x, ids, w)), (source.name, T)
        if biases:  # what the conversion kept matters: without it the layer is another one
            plain = ktforge.MoE.from_pretrained(out, layer=1, activation={"up_offset": 0.0})
            assert rel_err(plain.forward(x, ids, w), direct.forward(x, ids, w)) > 0.05
            _, _, kept = convert.load_layer(out, 1)
            with Checkpoint(source) as checkpoint:
                source_biases = checkpoint.biases(1)
            assert kept is not None and source_biases is not None
            assert all(np.array_equal(a, b) for a, b in zip(kept, source_biases, strict=True))


def test_gpt_oss_can_be_requantized(gpt_oss: Path) -> None:
    release = gpt_oss / "release"
    int8 = ktforge.MoE.from_pretrained(release, layer=1, method="int8")
    native = ktforge.MoE.from_pretrained(release, layer=1)
    x, ids, w = inputs(6, 8, 2, 64)
    assert int8.method == "int8" and rel_err(int8.forward(x, ids, w), native.forward(x, ids, w)) < 5e-2


def test_gpt_oss_not_in_mxfp4_and_a_wrong_expert_count_are_refused(gpt_oss: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"is not stored as MXFP4 .*gate_up_proj_blocks"):
        ktforge.MoE.from_pretrained(gpt_oss / "model", layer=1)  # transformers' own bf16 save
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    shutil.copy(gpt_oss / "release" / "model.safetensors", wrong / "model.safetensors")
    config = json.loads((gpt_oss / "release" / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps(config | {"num_local_experts": 16}))
    with pytest.raises(ValueError, match=r"num_local_experts = 16, but .* holds 8 experts"):
        ktforge.MoE.from_pretrained(wrong, layer=1)


def test_deepseek_v4_flash_fp4_experts_run_as_released(tmp_path: Path) -> None:
    # I8-packed E2M1 with E8M0 `.scale`s, the clamped SwiGLU's limit from the config
    E, k, H, I = 4, 2, 256, 128
    dense = write_deepseek_v4_flash(tmp_path, E=E, k=k, H=H, I=I)  # transformers' own dequantization
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "mxfp4"
    for T in (1, 40):
        x, ids, w = inputs(T, E, k, H)
        x *= 8  # gate values past the limit
        want = int8_activations_reference(x, ids, w, *dense.values(), block=32, activation={"swiglu_limit": 10.0})
        assert int8_layer_error(moe.forward(x, ids, w), want) < BOUND, T
        assert rel_err(int8_activations_reference(x, ids, w, *dense.values(), block=32), want) > 0.05  # the clamp acted
    assert moe.info["packed_bytes"] == _file_bytes(tmp_path, 1, E)
    assert_every_backend_serves(tmp_path, list(dense.values()), E, k, H, "mxfp4")


def test_deepseek_v4_base_fp8_experts_with_e8m0_block_scales(tmp_path: Path) -> None:
    E, k, H, I = 3, 2, 256, 128
    dense = write_deepseek_v4_base(tmp_path, E=E, k=k, H=H, I=I)
    moe = ktforge.MoE.from_pretrained(tmp_path, layer=1)
    assert moe.method == "fp8"
    x, ids, w = inputs(3, E, k, H)  # under 16 tokens an expert: fp8's exact fp32 activations
    want = float_reference(x, ids, w, *dense.values())
    assert rel_err(moe.forward(x, ids, w), np.asarray(want)) < 1e-4
