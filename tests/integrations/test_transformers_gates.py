"""Experts classes whose gating is a SwiGLU variant (gpt-oss's alpha, limit and up + 1 with
biases; DeepSeek-V4's clamp; their look-alikes) run on the kernels, against transformers' own
eager code for each class, built from its model type's config at a small size."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ktforge.transformers as kt_hf
from ktforge.engines.transformers import coverage as transformers_sweep

from .test_transformers import SMALL, _experts_modules, _prompt

# model type -> the experts class the gate table names (ktforge.transformers._GATES)
CLASSES = {
    "gpt_oss": "GptOssExperts",
    "openai_privacy_filter": "OpenAIPrivacyFilterExperts",
    "minimax_m3_vl": "MiniMaxM3VLExperts",
    "deepseek_v4": "DeepseekV4Experts",
    "glm5_next": "Glm5NextTextExperts",
    "hy_v4": "HYV4Experts",
}
SIZES = {"hidden_size": 64, "intermediate_size": 32, "moe_intermediate_size": 32, "expert_intermediate_size": 32}
COUNTS = {"num_local_experts": 8, "num_experts": 8, "n_routed_experts": 8}


def test_the_table_names_exactly_these_classes() -> None:
    assert set(kt_hf._GATES) == set(CLASSES.values())


def small_experts(model_type: str) -> Any:
    """The class built from its model type's config (or the sub-config it takes) at a small size,
    its parameters random."""
    cls = getattr(
        importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}"), CLASSES[model_type]
    )
    last: Exception | None = None
    for config in transformers_sweep._configs(AutoConfig.for_model(model_type)):
        for name, value in {**SIZES, **COUNTS}.items():
            if hasattr(config, name):
                setattr(config, name, value)
        try:
            module = cls(config)
        except Exception as error:  # a class that takes another sub-config: the next
            last = error
            continue
        torch.manual_seed(0)
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if "bias" not in name else 1.0))
        return module.eval()
    raise AssertionError(f"{CLASSES[model_type]} could not be built: {last}")


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_each_gate_runs_on_the_kernels_with_transformers_answer(model_type: str) -> None:
    module = small_experts(model_type)
    assert kt_hf.why_unsupported(module) is None
    E = module.gate_up_proj.shape[0]
    T, k = 24, 2
    x = torch.randn(T, 64) * 4  # gate and up values beyond the limits too
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    weights = torch.rand(T, k)
    with torch.inference_mode():
        module.config._experts_implementation = "eager"
        eager = module(x, ids, weights)
        module.config._experts_implementation = kt_hf.NAME
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            ours = module(x, ids, weights)
    assert kt_hf.handle_of(module) is not None
    settings = kt_hf.activation_of(module)
    assert settings.get("swiglu_limit") is not None
    assert float((ours - eager).abs().max() / eager.abs().max()) < 2e-2  # bf16 activations
    if getattr(module, "has_bias", False):
        assert kt_hf.packed_layer(module) is not None


def test_gpt_oss_runs_whole_on_the_kernels() -> None:
    config = AutoConfig.for_model(
        "gpt_oss",
        **{**SMALL, "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for module in _experts_modules(model):
            for name, p in module.named_parameters():
                p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5 if "bias" not in name else 4.0))
    prompt = _prompt()
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        eager = model(prompt).logits
        model.set_experts_implementation("ktforge")
        ours = model(prompt).logits
    assert all(kt_hf.handle_of(m) is not None for m in _experts_modules(model))
    assert float((ours - eager).abs().max() / eager.abs().max()) < 2e-2
