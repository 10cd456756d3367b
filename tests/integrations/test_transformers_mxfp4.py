"""gpt-oss's MXFP4 release in transformers: on a CPU transformers loads it by dequantizing the
experts to bf16 (convert_moe_packed_tensors); ``ktforge.transformers.load_checkpoint`` then runs
them from the file's own MXFP4 codes and scales, with gpt-oss's activation and biases, and frees
that copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.checkpoints.checkpoint import Checkpoint

from ..checkpoints.test_gpt_oss_model import saved_gpt_oss
from ..mxfp4_checkpoints import gpt_oss_release
from .test_transformers import TOLERANCE, _experts_modules, _prompt


def test_gpt_oss_experts_run_on_the_files_mxfp4_values(tmp_path: Path) -> None:
    saved_gpt_oss(tmp_path / "model")
    gpt_oss_release(tmp_path / "model", tmp_path / "release")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "release")
    prompt = _prompt()
    with torch.inference_mode():
        eager = model(prompt).logits.float()  # transformers' experts on its bf16 dequantization
    modules = _experts_modules(model)
    assert modules and all(m.gate_up_proj.dtype == torch.bfloat16 for m in modules)

    assert kt_hf.load_checkpoint(model, tmp_path / "release") == [0, 1]
    with Checkpoint(tmp_path / "release") as checkpoint:
        file_bytes = sum(
            checkpoint.source_bytes(layer, e, p) for layer in (0, 1) for e in range(8) for p in ("gate", "up", "down")
        )
    for module in modules:
        assert kt_hf.packed_layer(module).method == "mxfp4"
        assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0  # no bf16 copy left
    assert sum(kt_hf.packed_layer(m).info["packed_bytes"] for m in modules) == file_bytes
    with torch.inference_mode():
        ours = model(prompt).logits.float()
    # ours: int8 activations over the exact values; eager: bf16 activations and weights
    assert float((ours - eager).abs().max() / eager.abs().max()) < TOLERANCE["int8"]
    with pytest.raises(RuntimeError, match="release"):
        model.state_dict()
