"""Pre-quantized checkpoints, served as they are: ktforge claims the checkpoint's own
``quantization_config`` (vLLM's ``override_quantization_method``), computes the routed experts in
the file's values, and leaves every other layer to vLLM's own config for that checkpoint.

Claimed today:

- FP8 with block scales (``quant_method: fp8`` with ``weight_block_size``: DeepSeek-V3, the
  Qwen3-*-FP8 releases): :mod:`.fp8`;
- GPTQ, 4-bit, groups along K: :mod:`.int4`. Symmetric without act-order, vLLM's own GPTQ config
  keeps the other layers; act-order (``desc_act``) or asymmetric, which vLLM refuses for every
  layer ("gptq-vllm-refuses"), ktforge reads every GPTQ layer: the experts with their ``g_idx``,
  the linear layers dequantized at load;
- AWQ, 4-bit with zero points, AutoAWQ's GEMM layout: :mod:`.int4`;
- compressed-tensors ``pack-quantized`` INT4 with groups along K, symmetric or with zero points
  (Kimi-K2-Thinking, llm-compressor's W4A16): :mod:`.int4`, for the experts whose scheme it is;
- compressed-tensors ``float-quantized`` FP8, a scale per channel, block or tensor (llm-compressor's
  FP8 and FP8_DYNAMIC schemes, GLM's FP8 releases): :mod:`.fp8`, likewise;
- gpt-oss's MXFP4 release (``quant_method: mxfp4``): :mod:`.mxfp4`.

A checkpoint of another kind is vLLM's as before.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization import get_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from ktforge.checkpoints import gptq_awq
from ktforge.checkpoints import packed as ct_packed
from ktforge.engines.vllm import QUANTIZATION, fp8, int4, mxfp4
from ktforge.engines.vllm.method import say_once


def kind_of(config: dict[str, Any] | None) -> str | None:
    """The kind of checkpoint ktforge serves as it is ("fp8", "gptq", "gptq-vllm-refuses", "awq",
    "ct-int4", "ct-fp8" or "mxfp4"), from its ``quantization_config``; None: vLLM's as before."""
    if not isinstance(config, dict):
        return None
    method = config.get("quant_method")
    if method == "fp8":
        block = config.get("weight_block_size")
        blocks = isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
        return "fp8" if blocks else None
    if method == "gptq":
        try:
            scheme = gptq_awq.scheme_of(config, "quantization_config")
        except ValueError:  # 8-bit, per channel, another layout: vLLM's own, as before
            return None
        if scheme is None:
            return None
        return "gptq" if config.get("sym") is True and not config.get("desc_act") else "gptq-vllm-refuses"
    if method == "awq":
        try:
            awq = gptq_awq.scheme_of(config, "quantization_config")
        except ValueError:  # another version or bits: vLLM's own, as before
            return None
        return "awq" if awq is not None and config.get("zero_point", True) is not False else None
    if method in MXFP4_NAMES:
        return "mxfp4"
    if method == "compressed-tensors":
        try:
            packed = ct_packed.scheme_of(config, "quantization_config")
        except ValueError:  # another scheme: vLLM's own, as before
            return None
        if packed is not None:
            return "ct-int4" if packed.method == "int4" and packed.group > 0 else None
        return "ct-fp8" if _has_fp8_weights(config) else None
    return None


def _has_fp8_weights(config: dict[str, Any]) -> bool:
    """Whether a compressed-tensors config holds ``float-quantized`` 8-bit float weights."""
    groups = config.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        weights = group.get("weights") if isinstance(group, dict) else None
        layout = group.get("format", config.get("format")) if isinstance(group, dict) else None
        if (
            layout == "float-quantized"
            and isinstance(weights, dict)
            and (weights.get("type"), weights.get("num_bits")) == ("float", 8)
        ):
            return True
    return False


MXFP4_NAMES = ("mxfp4", "gpt_oss_mxfp4")  # the release's, and vLLM's name once it has read it
CT_FP8_LINEAR_SCHEMES = ("CompressedTensorsW8A8Fp8", "CompressedTensorsW8A16Fp8")  # vLLM's, of FP8 linear layers


def claims(config: dict[str, Any] | None, hf_config: Any = None) -> bool:
    """Whether ktforge serves checkpoints with this ``quantization_config`` as they are (MXFP4:
    gpt-oss's release only, as vLLM's own gpt-oss MXFP4 config claims it)."""
    kind = kind_of(config)
    return kind is not None and (kind != "mxfp4" or getattr(hf_config, "model_type", None) == "gpt_oss")


class CheckpointConfig(QuantizationConfig):  # type: ignore[misc]
    """vLLM's own config for the checkpoint (``own``), except for the routed experts."""

    def __init__(self, own: Any, config: dict[str, Any]) -> None:
        super().__init__()
        self.own = own
        self.kind = kind_of(config)
        if self.kind is None:
            raise ValueError(f"ktforge: not a checkpoint it serves as it is: {config.get('quant_method')!r}")
        if self.kind == "fp8":
            rows, cols = own.weight_block_size
            self.block = (int(rows), int(cols))
        elif self.kind in ("gptq", "gptq-vllm-refuses", "awq"):
            scheme = gptq_awq.scheme_of(config, "quantization_config")
            assert scheme is not None  # kind_of said gptq
            self.scheme = scheme

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any]) -> CheckpointConfig:
        kind = kind_of(config)
        name = "gpt_oss_mxfp4" if kind == "mxfp4" else str(config["quant_method"])
        # vLLM's GPTQ config refuses act-order and asymmetric groups: built as if neither, it
        # still names the layers that are quantized (ktforge reads their tensors itself)
        own_config = _without_act_order(config) if kind == "gptq-vllm-refuses" else config
        own = get_quantization_config(name).from_config(own_config)
        return cls(own, config)

    def __repr__(self) -> str:
        return f"CheckpointConfig(own={self.own!r})"

    def __getattr__(self, name: str) -> Any:  # what models and loaders read of vLLM's own config
        if name in ("own", "kind", "block", "scheme", "declared"):
            raise AttributeError(name)
        return getattr(self.own, name)

    @classmethod
    def get_name(cls) -> str:
        return QUANTIZATION

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return list(self.own.get_supported_act_dtypes())

    @classmethod
    def get_min_capability(cls) -> int:
        return -1

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CheckpointConfig:
        return cls.from_checkpoint(config)

    def get_cache_scale_mapper(self) -> Any:
        return self.own.get_cache_scale_mapper()

    def get_checkpoint_weight_mapper(self) -> Any:
        if self.kind == "gptq-vllm-refuses":  # its g_idx are read, where vLLM's mapper drops them
            from vllm.model_executor.models.utils import WeightsMapper

            return WeightsMapper()
        return self.own.get_checkpoint_weight_mapper()

    def apply_vllm_mapper(self, hf_to_vllm_mapper: Any) -> None:
        self.own.apply_vllm_mapper(hf_to_vllm_mapper)

    def maybe_update_config(self, *args: Any, **kwargs: Any) -> None:
        self.own.maybe_update_config(*args, **kwargs)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
        self.own.packed_modules_mapping = self.packed_modules_mapping  # the model sets it on this config
        if isinstance(layer, RoutedExperts):
            return self._experts(layer, prefix)
        method = self.own.get_quant_method(layer, prefix)
        if self.kind == "fp8" and isinstance(layer, LinearBase) and type(method).__name__ == "Fp8LinearMethod":
            return fp8.DequantizedLinearMethod(method)
        fp8_scheme = type(getattr(layer, "scheme", None)).__name__ in CT_FP8_LINEAR_SCHEMES
        if self.kind == "ct-fp8" and isinstance(layer, LinearBase) and fp8_scheme:
            return fp8.DequantizedLinearMethod(method)
        if self.kind == "gptq-vllm-refuses" and type(method).__name__ == "AutoGPTQLinearMethod":
            return self._refused_gptq_linear(layer, prefix, method.quant_config)
        own_int4 = ("AutoGPTQLinearMethod", "AutoAWQMarlinLinearMethod")
        if self.kind in ("gptq", "awq") and isinstance(layer, LinearBase) and type(method).__name__ in own_int4:
            return int4.DequantizedInt4LinearMethod(method, self.kind, self.scheme.zero_offset)
        return method

    def _refused_gptq_linear(self, layer: Any, prefix: str, own: Any) -> Any:
        if not isinstance(layer, LinearBase) or own.weight_bits != 4:
            what = f"{own.weight_bits}-bit" if isinstance(layer, LinearBase) else "quantized lm_head"
            raise ValueError(
                f"ktforge: {prefix} is a {what} GPTQ layer of a checkpoint with act-order or asymmetric groups, "
                "which vLLM does not serve; ktforge reads 4-bit linear layers of it"
            )
        return int4.DequantizedGptqLinearMethod(int(own.group_size), self.scheme.zero_offset)

    def _experts(self, layer: Any, prefix: str) -> Any:
        if self.kind == "gptq-vllm-refuses":
            return self._refused_gptq_experts(layer, prefix)
        if self.kind == "gptq":
            return self._gptq_experts(layer, prefix)
        if self.kind in ("ct-int4", "ct-fp8"):
            return self._compressed_experts(layer, prefix)
        if self.kind == "awq":
            return self._awq_experts(layer, prefix)
        if self.kind == "mxfp4":
            why_not = mxfp4.why_not_experts(layer.moe_config)
            if why_not is None:
                return mxfp4.KtforgeMxfp4MoEMethod(layer.moe_config)
            return self._fallback(layer, prefix, "MXFP4", why_not)
        if is_layer_skipped(
            prefix=prefix,
            ignored_layers=self.own.ignored_layers or [],
            fused_mapping=self.packed_modules_mapping,
            match_mode=getattr(self.own, "ignored_layers_match_mode", "exact"),
        ):
            return self.own.get_quant_method(layer, prefix)  # unquantized: ktforge's float method
        why_not = fp8.why_not_experts(layer.moe_config, self.block)
        if why_not is None:
            return fp8.KtforgeFp8MoEMethod(layer.moe_config, self.block)
        return self._fallback(layer, prefix, "FP8", why_not)

    def _gptq_experts(self, layer: Any, prefix: str) -> Any:
        """GPTQModel's ``dynamic`` rules may skip a layer or give it other bits or groups."""
        import copy

        from vllm.model_executor.layers.quantization.utils.gptq_utils import get_dynamic_override, override_config

        if get_dynamic_override(self.own, layer_name=prefix) is False:
            return self.own.get_quant_method(layer, prefix)  # unquantized: ktforge's float method
        own = copy.deepcopy(self.own)
        override_config(own, prefix=prefix)
        if own.weight_bits != 4 or own.desc_act:
            bits = f"{own.weight_bits}-bit{' act-order' if own.desc_act else ''}"
            return self._fallback(layer, prefix, "GPTQ", f"{bits} GPTQ (ktforge serves 4-bit)")
        scheme = gptq_awq.Scheme("gptq", int(own.group_size), self.scheme.zero_offset)
        why_not = int4.why_not_experts(layer.moe_config, scheme.group)
        if why_not is None:
            return int4.KtforgeGptqAwqMoEMethod(layer.moe_config, scheme)
        return self._fallback(layer, prefix, "GPTQ", why_not)

    def _refused_gptq_experts(self, layer: Any, prefix: str) -> Any:
        """Experts of a GPTQ checkpoint vLLM refuses: ktforge's, or an error (vLLM has no method)."""
        import copy

        from vllm.model_executor.layers.quantization.utils.gptq_utils import get_dynamic_override, override_config

        if get_dynamic_override(self.own, layer_name=prefix) is False:
            return self.own.get_quant_method(layer, prefix)  # unquantized: ktforge's float method
        own = copy.deepcopy(self.own)
        override_config(own, prefix=prefix)
        why_not = int4.why_not_experts(layer.moe_config, int(own.group_size), regrouped=True)
        if own.weight_bits != 4:
            why_not = f"its experts are {own.weight_bits}-bit (ktforge serves 4-bit)"
        if why_not is not None:
            raise ValueError(
                f"ktforge: {prefix}: vLLM serves no GPTQ with act-order or asymmetric groups, and {why_not}"
            )
        scheme = gptq_awq.Scheme("gptq", int(own.group_size), self.scheme.zero_offset)
        return int4.KtforgeGptqAwqMoEMethod(layer.moe_config, scheme, g_idx=True)

    def _awq_experts(self, layer: Any, prefix: str) -> Any:
        skipped = self.own.modules_to_not_convert or []
        if is_layer_skipped(prefix, skipped, self.packed_modules_mapping, match_mode="substring"):
            return self.own.get_quant_method(layer, prefix)  # unquantized: ktforge's float method
        why_not = int4.why_not_experts(layer.moe_config, self.scheme.group)
        if why_not is None:
            return int4.KtforgeGptqAwqMoEMethod(layer.moe_config, self.scheme)
        return self._fallback(layer, prefix, "AWQ", why_not)

    def _compressed_experts(self, layer: Any, prefix: str) -> Any:
        """The experts' own scheme (the config's groups target layers by name or class), as vLLM's
        compressed-tensors MoE method finds it: from the first expert's projections."""
        self.own._add_fused_moe_to_target_scheme_map()
        names = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name)
        schemes = [self.own.get_scheme_dict(layer, f"{prefix}.0.{name}") for name in names]
        if schemes[0] is None or any(s != schemes[0] for s in schemes):
            return self.own.get_quant_method(layer, prefix)  # unquantized (ktforge's float method), or vLLM's error
        weights, inputs, layout = (
            schemes[0].get("weights"),
            schemes[0].get("input_activations"),
            schemes[0].get("format"),
        )
        strategy, kind, actorder = (_value(getattr(weights, name, None)) for name in ("strategy", "type", "actorder"))
        if layout == "float-quantized" and kind == "float" and getattr(weights, "num_bits", None) == 8:
            return self._compressed_fp8_experts(layer, prefix, strategy, weights, inputs)
        if (
            layout != "pack-quantized"
            or kind != "int"
            or getattr(weights, "num_bits", None) != 4
            or strategy != "group"
            or inputs is not None
            or actorder not in (None, "static")
        ):
            found = f"its scheme is {layout} {getattr(weights, 'num_bits', '?')}-bit {kind} {strategy}"
            return self._fallback(layer, prefix, "compressed-tensors", found + " (ktforge serves W4A16 groups)")
        scheme = ct_packed.Scheme("int4", int(weights.group_size), bool(weights.symmetric))
        why_not = int4.why_not_experts(layer.moe_config, scheme.group)
        if why_not is None:
            return int4.KtforgeCompressedInt4MoEMethod(layer.moe_config, scheme)
        return self._fallback(layer, prefix, "compressed-tensors", why_not)

    def _compressed_fp8_experts(self, layer: Any, prefix: str, strategy: str | None, weights: Any, inputs: Any) -> Any:
        """FP8 experts with a scale per block, channel or tensor; vLLM's own method is not built
        where ktforge serves them (it refuses the layer where its FP8 MoE kernels need AMX)."""
        block = getattr(weights, "block_structure", None)
        block = (int(block[0]), int(block[1])) if strategy == "block" and block else None
        why_not: str | None = f"its FP8 weights' strategy is {strategy} (ktforge reads {', '.join(fp8.STRATEGIES)})"
        if strategy in fp8.STRATEGIES and (strategy != "block" or block is not None):
            why_not = fp8.why_not_experts(layer.moe_config, block)
        if why_not is not None:
            return self._fallback(layer, prefix, "compressed-tensors", why_not)
        static = inputs is not None and getattr(inputs, "dynamic", True) is False
        return fp8.KtforgeCompressedFp8MoEMethod(layer.moe_config, str(strategy), block, static)

    def _fallback(self, layer: Any, prefix: str, kind: str, why_not: str) -> Any:
        say_once(
            f"fallback:{why_not}",
            "ktforge: %s runs vLLM's own %s MoE kernels: %s",
            prefix,
            kind,
            why_not,
            warning=True,
        )
        return self.own.get_quant_method(layer, prefix)


def _without_act_order(config: dict[str, Any]) -> dict[str, Any]:
    """A GPTQ config as vLLM's own GPTQ config takes it: symmetric, no act-order (nor in its rules)."""
    rules = config.get("dynamic") or {}
    dynamic = {
        pattern: {k: v for k, v in rule.items() if k not in ("desc_act", "sym")} if isinstance(rule, dict) else rule
        for pattern, rule in rules.items()
    }
    return config | {"desc_act": False, "sym": True, "dynamic": dynamic}


def _value(field: Any) -> str | None:
    """A compressed-tensors enum field's value (or the field) as text; None where it is unset."""
    return None if field is None else str(getattr(field, "value", field))
