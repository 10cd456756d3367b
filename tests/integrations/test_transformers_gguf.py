"""A GGUF in transformers: transformers loads it (``gguf_file=``) by dequantizing every tensor;
``ktforge.transformers.load_checkpoint`` then runs the experts from the file's own Q4_K values and
frees transformers' copy. The model is a whole tiny Qwen3-MoE written by gguf-py's GGUFWriter and
quantized by llama.cpp's quantizer (tests/fixtures/gguf/qwen3moe-model-Q4_K.gguf)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.gguf import GgufCheckpoint

from .test_transformers import TOLERANCE, _experts_modules

MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "gguf" / "qwen3moe-model-Q4_K.gguf"


def load() -> Any:
    return AutoModelForCausalLM.from_pretrained(MODEL.parent, gguf_file=MODEL.name, dtype=torch.float32)


def test_the_experts_run_on_the_ggufs_own_values() -> None:
    model = load()
    prompt = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' experts on its float32 dequantization
    modules = _experts_modules(model)
    assert len(modules) == 1
    assert kt_hf.load_checkpoint(model, MODEL) == [0]
    layer = kt_hf.packed_layer(modules[0])
    assert layer.method == "q4_k" and layer.routing is not None
    assert modules[0].gate_up_proj.numel() == 0 and modules[0].down_proj.numel() == 0  # no dequantized copy left
    with GgufCheckpoint(MODEL) as checkpoint:
        assert layer.info["packed_bytes"] == pytest.approx(checkpoint.source_bytes(0) * 148 / 144)
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    # the same values; ours with int8 activations, eager with exact ones
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["int8"]
    # a second load of the same file says so, and the layer stays as it was
    with pytest.raises(ValueError, match=r"already loaded by ktforge .* load the model again first") as refused:
        kt_hf.load_checkpoint(model, MODEL)
    assert "\n" not in str(refused.value) and kt_hf.packed_layer(modules[0]) is layer


def test_a_gguf_of_another_model_is_refused() -> None:
    model = load()
    other = MODEL.parent / "qwen3moe-Q4_K.gguf"  # 256-wide experts: another model's sizes
    with pytest.raises(ValueError, match="is not the GGUF of this model"):
        kt_hf.load_checkpoint(model, other)


def test_an_unsloth_style_i_quant_model_runs_its_experts_as_stored() -> None:
    # UD-Q2_K_XL's experts (gate/up IQ2_XS, down IQ3_XXS), the attention Q4_K/Q6_K, as llama.cpp's
    # quantizer writes them with an importance matrix
    path = MODEL.parent / "qwen3moe-model-UD-Q2_K_XL.gguf"
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    prompt = torch.randint(0, 259, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' experts on gguf-py's dequantization
    assert kt_hf.load_checkpoint(model, path) == [0]
    layer = kt_hf.packed_layer(_experts_modules(model)[0])
    assert (layer.method, layer.down_method) == ("iq2_xs", "iq3_xxs")
    with GgufCheckpoint(path) as checkpoint:
        assert layer.info["packed_bytes"] == checkpoint.source_bytes(0)  # the file's size
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["int8"]
