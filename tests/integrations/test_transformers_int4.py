"""An INT4 (compressed-tensors pack-quantized) checkpoint in transformers: transformers loads it on
a CPU by dequantizing the experts to bf16; ``ktforge.transformers.load_checkpoint`` then runs them
from the file's own codes and scales (method "int4", the file's group) and frees that copy."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.checkpoint import Checkpoint

from ..int4_checkpoints import int4_copy
from .test_transformers import TOLERANCE, _experts_modules, _prompt, tiny_model


def test_the_experts_run_on_the_files_int4_values(tmp_path: Path) -> None:
    tiny_model("qwen3_moe", seed=0).save_pretrained(tmp_path / "model")
    int4_copy(tmp_path / "model", tmp_path / "int4", group=32)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "int4")
    prompt = _prompt()
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' experts on its bf16 dequantization
    modules = _experts_modules(model)
    assert modules and all(m.gate_up_proj.dtype == torch.bfloat16 for m in modules)

    assert kt_hf.load_checkpoint(model, tmp_path / "int4") == [0, 1]
    with Checkpoint(tmp_path / "int4") as checkpoint:
        file_bytes = sum(
            checkpoint.source_bytes(layer, e, p) for layer in (0, 1) for e in range(8) for p in ("gate", "up", "down")
        )
    for module in modules:
        layer = kt_hf.packed_layer(module)
        assert layer.method == "int4" and layer._group == 32
        assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0  # no bf16 copy left
    packed = sum(kt_hf.packed_layer(m).info["packed_bytes"] for m in modules)
    assert packed <= file_bytes
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    # ours: int8 activations over the exact values; eager: bf16 activations over bf16-rounded ones
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["int8"]
