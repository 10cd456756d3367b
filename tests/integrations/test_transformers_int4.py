"""An INT4 (compressed-tensors pack-quantized) checkpoint in transformers: transformers loads it on
a CPU by dequantizing the experts to bf16; ``ktforge.transformers.load_checkpoint`` then runs them
from the file's own codes and scales (method "int4", the file's group) and frees that copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.checkpoint import Checkpoint

from ..int4_checkpoints import int4_copy
from .test_transformers import TOLERANCE, _experts_modules, _prompt, tiny_model


def assert_served_from_the_files(release: Path, method: str, group: int) -> tuple[int, int]:
    """transformers loads ``release`` (dequantizing its experts to bf16); load_checkpoint then runs
    every experts module on the file's own values in ``method``, transformers' copy freed, the
    logits within int8 activations' tolerance of transformers' own. Returns (packed bytes, the
    file's expert bytes)."""
    model: Any = AutoModelForCausalLM.from_pretrained(release)
    prompt = _prompt()
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' experts on its bf16 dequantization
    modules = _experts_modules(model)
    assert modules and all(m.gate_up_proj.dtype == torch.bfloat16 for m in modules)

    assert kt_hf.load_checkpoint(model, release) == [0, 1]
    with Checkpoint(release) as checkpoint:
        file_bytes = sum(
            checkpoint.source_bytes(layer, e, p) for layer in (0, 1) for e in range(8) for p in ("gate", "up", "down")
        )
    for module in modules:
        layer = kt_hf.packed_layer(module)
        assert layer.method == method and layer._group == group
        assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0  # no bf16 copy left
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    # ours: int8 activations over the exact values; eager: bf16 activations over bf16-rounded ones
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["int8"]
    return sum(kt_hf.packed_layer(m).info["packed_bytes"] for m in modules), file_bytes


def test_the_experts_run_on_the_files_int4_values(tmp_path: Path) -> None:
    tiny_model("qwen3_moe", seed=0).save_pretrained(tmp_path / "model")
    int4_copy(tmp_path / "model", tmp_path / "int4", group=32)
    packed, file_bytes = assert_served_from_the_files(tmp_path / "int4", "int4", 32)
    assert packed <= file_bytes
