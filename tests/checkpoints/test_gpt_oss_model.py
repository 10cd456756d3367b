"""The tiny gpt-oss model the MXFP4 tests release (tests/mxfp4_checkpoints.py), saved by transformers."""

from __future__ import annotations

from pathlib import Path


def saved_gpt_oss(directory: Path, seed: int = 0) -> None:
    """A random tiny gpt-oss (hidden 64, intermediate 64, 8 experts, top 2, 2 layers), bf16, its
    experts' weights and biases at the scales of a trained model's, saved by save_pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..integrations.test_transformers import SMALL

    config = AutoConfig.for_model(
        "gpt_oss",
        **{**SMALL, "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                p.copy_(torch.randn_like(p) / (p.shape[1] ** 0.5 if "bias" not in name else 4.0))
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(directory)
