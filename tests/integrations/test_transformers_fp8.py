"""An FP8 checkpoint in transformers: transformers loads it on a CPU by dequantizing to bf16;
``ktforge.transformers.load_checkpoint`` then runs the experts from the file's own FP8 values
and frees the dequantized copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.checkpoint import Checkpoint

from ..fp8_checkpoints import fp8_copy
from .test_transformers import TOLERANCE, _experts_modules, _prompt, tiny_model


def _fp8_release(tmp_path: Path, seed: int = 0) -> Path:
    model = tiny_model("qwen3_moe", seed=seed)
    model.save_pretrained(tmp_path / f"model-{seed}")
    fp8_copy(tmp_path / f"model-{seed}", tmp_path / f"fp8-{seed}")
    return tmp_path / f"fp8-{seed}"


def _load(path: Path) -> object:
    # transformers' own FP8 loading on a CPU: it says it dequantizes to bf16, and does
    return AutoModelForCausalLM.from_pretrained(path)


def test_the_experts_run_on_the_files_fp8_values(tmp_path: Path) -> None:
    path = _fp8_release(tmp_path)
    model = _load(path)
    prompt = _prompt()
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' eager experts on its dequantized copy
    modules = _experts_modules(model)
    assert modules and all(m.gate_up_proj.dtype == torch.bfloat16 for m in modules)

    assert kt_hf.load_checkpoint(model, path) == [0, 1]
    assert model.config._experts_implementation == "ktforge"
    with Checkpoint(path) as checkpoint:
        file_bytes = sum(
            checkpoint.source_bytes(layer, e, p) for layer in (0, 1) for e in range(8) for p in ("gate", "up", "down")
        )
    packed = sum(kt_hf.packed_layer(m).info["packed_bytes"] for m in modules)
    for module in modules:
        assert kt_hf.packed_layer(module).method == "fp8"
        assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0  # no bf16 copy left
    # the kernels' panels pad K (hidden 64, intermediate 32) to one 128-value group: at real sizes
    # (K a multiple of 128) they are the file's bytes (tests/checkpoints/test_fp8_checkpoints.py)
    assert packed <= file_bytes * (128 / 32) * 1.01
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    # ours are exact fp32 sums over the file's values; eager's round activations and weights to bf16
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["bf16"]
    with pytest.raises(RuntimeError, match="release"):
        model.state_dict()


def test_another_models_checkpoint_is_refused(tmp_path: Path) -> None:
    model = _load(_fp8_release(tmp_path, seed=0))
    other = _fp8_release(tmp_path, seed=5)  # the same sizes, other weights
    with pytest.raises(ValueError, match=r"does not hold this model.s weights"):
        kt_hf.load_checkpoint(model, other)
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(model))  # nothing changed
    assert all(m.gate_up_proj.numel() > 0 for m in _experts_modules(model))
