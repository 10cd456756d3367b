"""A GGUF model's routed experts, served in the file's own values: each layer's merged expert
tensors (``blk.{L}.ffn_{gate,up,down}_exps.weight``), the sizes and routing the file's metadata
states (data/gguf_architectures.toml says where, per architecture), and each tensor's ggml type
repacked into the format that keeps its values exactly (data/gguf_types.json), or refused
naming the type and the tensor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ktforge import formats
from ktforge.checkpoints import gguf_blocks
from ktforge.checkpoints.gguf_file import GgufError, GgufModel
from ktforge.files import shown
from ktforge.formats.quantize import Quantized
from ktforge.resources import data_path, load_toml

PROJECTIONS = ("gate", "up", "down")
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_selected"}  # llama.cpp's expert gating func codes


@cache
def architectures() -> dict[str, dict[str, Any]]:
    return load_toml(data_path("gguf_architectures.toml"))


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a .gguf file, or a directory holding .gguf files."""
    target = Path(path)
    return target.suffix == ".gguf" or (target.is_dir() and any(target.glob("*.gguf")))


@dataclass(frozen=True)
class Routing:
    """How the model turns a token's router logits ``[T, E]`` into its experts and weights."""

    top_k: int
    gating: str  # softmax, sigmoid or softmax_selected (see data/gguf_architectures.toml)
    normalize: bool
    scale: float = 1.0
    experts: int | None = None  # the logits' width, where known (a file's expert_count)

    def route(self, logits: Any, bias: Any = None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """ids int64 ``[T, k]`` and weights float32 ``[T, k]`` (``bias``: the correction added to
        the scores for choosing, not for weighting, as DeepSeek-V3's ``exp_probs_b``). ValueError
        for logits that are not ``[T, experts]`` finite numbers, or a bias not ``[experts]``."""
        z = np.asarray(logits, dtype=np.float64)
        width = self.experts or (z.shape[-1] if z.ndim == 2 else 0)
        if z.ndim != 2 or z.shape[1] != width or width < self.top_k or not np.isfinite(z).all():
            raise ValueError(
                f"route: logits must be [tokens, {self.experts or 'experts >= top_k'}] finite numbers, "
                f"got shape {z.shape}{'' if z.ndim != 2 or np.isfinite(z).all() else ' with NaN or infinity'}"
            )
        if bias is not None:
            b = np.asarray(bias, dtype=np.float64)
            if b.shape != (width,) or not np.isfinite(b).all():
                raise ValueError(f"route: bias must be [{width}] finite numbers, got shape {b.shape}")
        if self.gating == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-z))
        elif self.gating == "softmax":
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            scores = e / e.sum(axis=-1, keepdims=True)
        else:
            scores = z
        choice = scores if bias is None else scores + np.asarray(bias, dtype=np.float64)
        ids = np.argsort(-choice, axis=-1, kind="stable")[..., : self.top_k]
        weights = np.take_along_axis(scores, ids, axis=-1)
        if self.gating == "softmax_selected":
            e = np.exp(weights - weights.max(axis=-1, keepdims=True))
            weights = e / e.sum(axis=-1, keepdims=True)
        if self.normalize:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return ids.astype(np.int64), (weights * self.scale).astype(np.float32)


class GgufCheckpoint:
    """The routed experts of a GGUF model (a file, a split model's parts, or a directory)."""

    def __init__(self, path: str | Path) -> None:
        self.model = GgufModel(path)
        self.path = self.model.path
        meta = self.model.metadata
        self.architecture = str(meta.get("general.architecture", ""))
        known = architectures()
        if self.architecture not in known:
            self.close()
            raise GgufError(
                f"{self.path}: architecture {shown(self.architecture)} is not one whose experts ktforge reads "
                f"({', '.join(known)})"
            )
        arch = self._arch = known[self.architecture]

        try:
            self._read_metadata(arch)
        except GgufError:
            self.close()
            raise

    def _value(self, key: str, kind: type, check: Any, what: str, default: Any = None) -> Any:
        """The metadata value ``{architecture}.{key}`` (``default`` where absent and one is given):
        of type ``kind`` (an int is no bool, a float may be an int) and passing ``check``, else a
        GgufError naming the key, the value and what it must be."""
        full = f"{self.architecture}.{key}"
        value = self.model.metadata.get(full)
        if value is None and default is not None:
            return default
        typed = (
            isinstance(value, bool)
            if kind is bool
            else (isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool))
        )
        if not typed or not check(value):
            raise GgufError(f"{self.path}: metadata {full} is {shown(value)}, not {what}")
        return value

    def _read_metadata(self, arch: dict[str, Any]) -> None:
        """Sizes and routing, each through ``_value``; the layers are those whose expert tensors the
        file holds (below block_count), never a loop over a count the file states."""

        def number(key: str) -> int:
            return int(self._value(key, int, lambda v: 0 < v < 2**31, "a positive integer below 2^31"))

        self.experts, self.top_k = number("expert_count"), number("expert_used_count")
        self.hidden, self.intermediate = number("embedding_length"), number(arch["intermediate"])
        blocks = number("block_count")
        if self.top_k > self.experts:
            raise GgufError(f"{self.path}: expert_used_count {self.top_k} is more than expert_count {self.experts}")
        present = (re.fullmatch(r"blk\.(\d{1,9})\.ffn_gate_exps\.weight", name) for name in self.model.tensors)
        self.moe_layers = sorted(int(m.group(1)) for m in present if m and int(m.group(1)) < blocks)
        gating = arch["gating"]
        if "gating_key" in arch:
            codes = ", ".join(f"{code} ({name})" for code, name in GATING.items())
            # 0: unset, the architecture's own (llama.cpp reads it so for older DeepSeek-V2 files)
            code = self._value(arch["gating_key"], int, lambda v: v == 0 or v in GATING, f"0 or one of {codes}", 0)
            gating = GATING.get(code, gating)
        normalize = bool(self._value(arch.get("normalize_key", ""), bool, lambda _: True, "a bool", arch["normalize"]))
        scale = float(
            self._value(
                arch.get("scale_key", ""), float, lambda v: math.isfinite(v) and v >= 0, "a finite scale >= 0", 1.0
            )
        )
        self.routing = Routing(self.top_k, gating, normalize, scale or 1.0, self.experts)  # 0: unset, as llama.cpp

    @staticmethod
    def tensor_name(layer: int, projection: str, part: str = "weight") -> str:
        return f"blk.{layer}.ffn_{projection}_exps.{part}"

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> GgufCheckpoint:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def activation(self) -> dict[str, float]:
        return dict(self._arch.get("activation", {}))

    def _shape(self, projection: str) -> tuple[int, int, int]:
        n, k = (self.hidden, self.intermediate) if projection == "down" else (self.intermediate, self.hidden)
        return self.experts, n, k

    def stored_formats(self, layer: int) -> dict[str, tuple[str, int]]:
        """Each projection's format that holds its tensor exactly, and its group (the file's
        blocks'; q4_k: its 32-value groups); GgufError naming the tensor and its type where a type
        is not served, or where gate and up (one matrix in the kernels) need different ones."""
        if layer not in self.moe_layers:
            raise GgufError(f"{self.path}: layer {layer} holds no routed experts; MoE layers are {self.moe_layers}")
        served: dict[str, tuple[str, int]] = {}
        for projection in PROJECTIONS:
            name = self.tensor_name(layer, projection)
            info = self.model.tensors.get(name)
            if info is None:
                raise GgufError(f"{self.path}: tensor {name} is missing")
            if info.shape != self._shape(projection):
                raise GgufError(f"{self.path}: {name} is {info.shape}, the metadata says {self._shape(projection)}")
            if info.type.served_as is None:
                raise GgufError(
                    f"{self.path}: {name} is {info.type.name}, which ktforge does not compute: {info.type.why}"
                )
            block = info.type.block_values
            served[projection] = (
                info.type.served_as,
                formats.group_for(info.type.served_as, block) if block > 1 else 128,
            )
        if served["gate"] != served["up"]:
            types = ", ".join(f"{p} {self.model.tensors[self.tensor_name(layer, p)].type.name}" for p in PROJECTIONS)
            raise GgufError(
                f"{self.path}: layer {layer}'s gate and up need different formats ({types}: gate "
                f"{served['gate'][0]}, up {served['up'][0]}); the kernels compute them as one matrix"
            )
        return served

    def quantized(self, layer: int, projection: str) -> Quantized:
        """One projection's experts in their format's portable layout, the file's values: with
        NVFP4, each expert's ``.scale`` (ModelOpt's weight_scale_2, which llama.cpp multiplies the
        expert's output by) as the tensor scale of its rows."""
        from dataclasses import replace

        info = self.model.tensors[self.tensor_name(layer, projection)]
        q = gguf_blocks.REPACK[info.type.name](self.model.data(info.name))
        scale = self._expert_scales(layer, projection)
        if q.global_scale is not None:
            return q if scale is None else replace(q, global_scale=q.global_scale * scale[:, None])
        if scale is not None and not (scale == 1).all():
            raise GgufError(
                f"{self.path}: {self.tensor_name(layer, projection, 'scale')} scales the outputs of "
                f"{info.type.name} experts; ktforge applies such per-expert scales to NVFP4 experts only"
            )
        return q

    def _expert_scales(self, layer: int, projection: str) -> np.ndarray[Any, Any] | None:
        """The ``blk.{L}.ffn_{p}_exps.scale`` tensor (F32, one value an expert), None where absent."""
        name = self.tensor_name(layer, projection, "scale")
        info = self.model.tensors.get(name)
        if info is None:
            return None
        scale = np.array(self.model.data(name)).view(np.float32).reshape(-1) if info.type.name == "F32" else None
        if scale is None or scale.shape != (self.experts,) or not np.isfinite(scale).all():
            raise GgufError(f"{self.path}: {name} is not {self.experts} finite F32 values (one an expert)")
        return scale

    def biases(self, layer: int) -> tuple[np.ndarray[Any, Any], ...] | None:
        """gpt-oss's expert biases (float32 [E, I], [E, I], [E, H]); None for the others."""
        if not self._arch.get("biases"):
            return None
        out = []
        for projection in PROJECTIONS:
            info = self.model.tensors.get(self.tensor_name(layer, projection, "bias"))
            if info is None or info.type.name != "F32":
                raise GgufError(f"{self.path}: {self.tensor_name(layer, projection, 'bias')} is missing or not F32")
            out.append(np.array(self.model.data(info.name).view(np.float32)))
        return tuple(out)

    def source_bytes(self, layer: int) -> int:
        return sum(self.model.tensors[self.tensor_name(layer, p)].nbytes for p in PROJECTIONS)


__all__ = ["GgufCheckpoint", "GgufError", "Routing", "is_gguf"]
