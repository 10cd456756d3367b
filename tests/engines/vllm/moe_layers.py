"""What each routed-experts layer of a vLLM worker's model runs on (driver.py offline)."""

from __future__ import annotations

from typing import Any


def moe_state(model: Any) -> list[dict[str, Any]]:
    """Each routed-experts layer of a worker's model: its method, ktforge handle, vLLM's weights."""
    layers = []
    for name, module in model.named_modules():
        if hasattr(module, "w13_weight") and hasattr(module, "quant_method"):
            method = module.quant_method
            layers.append(
                {
                    "name": name,
                    "method": type(method).__name__,
                    "kt_method": getattr(method, "kt_method", None),
                    "kt_group": getattr(method, "kt_group", None),
                    "on_ktforge": getattr(method, "handle", None) is not None,
                    "vllm_weight_elements": int(module.w13_weight.numel() + module.w2_weight.numel()),
                }
            )
    return layers
