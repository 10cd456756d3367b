"""``--quantization ktforge``: ktforge's online formats for the routed experts of a float checkpoint,
and the name under which ktforge serves pre-quantized checkpoints as they are (:mod:`.checkpoint`).

    vllm serve DIR --quantization ktforge                     # int8 experts
    vllm serve DIR --quantization ktforge \\
        --hf-overrides '{"quantization_config": {"quant_method": "ktforge", "method": "int4", "group_size": 64}}'

``method`` is any format ``ktforge.MoE`` quantizes floats to (int8 by default, as kt-kernel's
AMXINT8; int4, int8g, int4z, fp8, mxfp4, ...) and ``group_size`` its group (by default the
format's largest that divides the layer's sizes). Every other layer stays as the checkpoint has
it (vLLM's unquantized linear method); a MoE layer the kernels cannot compute runs vLLM's bf16
path, after one log line naming the reason.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ktforge import formats
from ktforge.engines.vllm import QUANTIZATION
from ktforge.engines.vllm.method import KtforgeMoEMethod
from ktforge.formats.quantize import METHODS

DEFAULT_METHOD = "int8"


class KtforgeConfig(QuantizationConfig):  # type: ignore[misc]
    def __init__(self, method: str = DEFAULT_METHOD, group_size: int | None = None) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"ktforge: quantization_config method must be one of {', '.join(METHODS)}, got {method!r}")
        if group_size is not None:
            formats.check_group(method, group_size)
        self.method, self.group_size = method, group_size

    def __repr__(self) -> str:
        return f"KtforgeConfig(method={self.method!r}, group_size={self.group_size!r})"

    @classmethod
    def get_name(cls) -> str:
        return QUANTIZATION

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPUs have no CUDA capability

    @classmethod
    def get_config_filenames(cls) -> list[str]:
        return []

    @classmethod
    def override_quantization_method(
        cls, hf_quant_cfg: dict[str, Any], user_quant: str | None, hf_config: Any = None
    ) -> str | None:
        """A pre-quantized checkpoint ktforge serves as it is, unless the user named another method."""
        from ktforge.engines.vllm import checkpoint

        claimed = checkpoint.claims(hf_quant_cfg, hf_config)
        return QUANTIZATION if user_quant in (None, QUANTIZATION) and claimed else None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        if config.get("quant_method", QUANTIZATION) != QUANTIZATION:  # a checkpoint's own, claimed above
            from ktforge.engines.vllm import checkpoint

            return checkpoint.CheckpointConfig.from_checkpoint(config)
        unknown = set(config) - {"quant_method", "method", "group_size"}
        if unknown:
            raise ValueError(f"ktforge: unknown quantization_config key(s) {', '.join(sorted(unknown))}")
        group = config.get("group_size")
        if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
            raise ValueError(f"ktforge: quantization_config group_size must be a whole number, got {group!r}")
        return cls(str(config.get("method", DEFAULT_METHOD)), group)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        if isinstance(layer, RoutedExperts):
            return KtforgeMoEMethod(layer.moe_config, self.method, self.group_size)
        return None


def install() -> None:
    register_quantization_config(QUANTIZATION)(KtforgeConfig)
