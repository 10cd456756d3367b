"""An NVFP4 (compressed-tensors ``nvfp4-pack-quantized``) release in transformers.

transformers 5.23 loads it on a CPU by dequantizing the experts to bf16, but without their tensor
scale (``weight_global_scale``: huggingface/transformers#48371, open), so its own logits are
another model's. ``ktforge.transformers.load_checkpoint`` recognises that copy (the file's values
over the tensor scale), runs the experts from the file's own codes and scales (method "nvfp4"),
frees the copy, and gives the logits of the release's bf16 twin (the library's own
dequantization), within int8 activations' tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.checkpoint import Checkpoint

from ..nvfp4_checkpoints import nvfp4_copy
from .test_transformers import TOLERANCE, _experts_modules, _prompt, tiny_model


def test_the_experts_run_on_the_files_nvfp4_values(tmp_path: Path) -> None:
    tiny_model("qwen3_moe", seed=0).save_pretrained(tmp_path / "model")
    nvfp4_copy(tmp_path / "model", tmp_path / "nvfp4", tmp_path / "bf16")
    prompt = _prompt()
    twin: Any = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    model: Any = AutoModelForCausalLM.from_pretrained(tmp_path / "nvfp4")
    with torch.inference_mode():
        want = twin(prompt).logits.float()
        eager = model(prompt).logits.float()  # transformers' experts, their tensor scales missing
    assert float((eager - want).abs().max() / want.abs().max()) > 0.5  # if this fails, transformers fixed #48371

    assert kt_hf.load_checkpoint(model, tmp_path / "nvfp4") == [0, 1]
    modules = _experts_modules(model)
    for module in modules:
        layer = kt_hf.packed_layer(module)
        assert layer is not None and layer.method == "nvfp4"
        assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0  # no bf16 copy left
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    assert float((ours - want).abs().max() / want.abs().max()) < TOLERANCE["int8"]
    with Checkpoint(tmp_path / "nvfp4") as checkpoint:
        E, H, I = checkpoint.experts, checkpoint.hidden, checkpoint.intermediate
        file_bytes = sum(
            checkpoint.source_bytes(layer, e, p) for layer in (0, 1) for e in range(E) for p in ("gate", "up", "down")
        )
    packed = sum(kt_hf.packed_layer(m).info["packed_bytes"] for m in modules)  # type: ignore[union-attr]
    # the file's codes and scales; a float32 tensor scale a row where the file has one a tensor
    assert packed == file_bytes + 4 * 2 * E * (2 * I + H) - 4 * 2 * E * 3
