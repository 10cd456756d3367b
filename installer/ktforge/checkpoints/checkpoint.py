"""A Hugging Face checkpoint's routed experts: found by name, read one expert at a time.

``Checkpoint(path)`` reads ``config.json``, the shard index (or the shards' own headers) and
finds the layers holding routed experts by the naming of the architecture in
``data/checkpoint_architectures.toml``. ``expert(layer, e, projection)`` returns one expert's
weights ``[N, K]`` in Hugging Face orientation: float as stored, or a quantized format as stored
(``formats.quantize.Stored``): FP8 E4M3 with its scales (DeepSeek-V3's ``weight_scale_inv`` per
128 x 128 block, from ``quantization_config.weight_block_size``; compressed-tensors' channel,
block and tensor scales; DeepSeek-V4's E8M0 ``.scale``), INT4 with its group scales and zero
points (compressed-tensors' ``pack-quantized``, GPTQ's and AWQ's layouts: ``packed``,
``gptq_awq``), MXFP4 (gpt-oss's fused blocks, DeepSeek-V4-Flash's FP4, compressed-tensors') or
NVFP4 (ModelOpt's and compressed-tensors': ``nvfp4``), or MXFP8 (E4M3 with an E8M0 scale per 32:
MiniMax-M3's, compressed-tensors' ``mxfp8-quantized``, ModelOpt's).
Every failure names the file and the tensor.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np

from ktforge import formats
from ktforge.checkpoints import fp4, fp8, gptq_awq
from ktforge.checkpoints import packed as ct_packed
from ktforge.checkpoints.safetensors_io import SafetensorsError, SafetensorsFile
from ktforge.files import UnsafePath, canonical, leaves_directory, member, open_regular, read_json, shown
from ktforge.formats.quantize import Fp8Blocks, Int4Groups, Mxfp4Groups, Mxfp8Groups, Nvfp4Groups, Stored
from ktforge.resources import data_path, load_toml

Array = np.ndarray[Any, Any]
P = ParamSpec("P")
R = TypeVar("R")
PROJECTIONS = ("gate", "up", "down")
INPUT_TYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32", "fp8": "F8_E4M3"}
INDEX_NAME = "model.safetensors.index.json"
FP8_SCALE_SUFFIXES = ("_scale_inv", "_scale")
SCALE_SIBLING = ".scale"  # DeepSeek-V4's: {base}.scale beside {base}.weight
MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"  # gpt-oss's fused MXFP4 tensors


class CheckpointError(ValueError):
    """The checkpoint is missing something, or holds something ktforge cannot convert."""


@dataclass(frozen=True)
class Architecture:
    model_type: str
    label: str
    tensor: str
    projections: dict[str, str]
    config: dict[str, str | list[str]]  # a size's key in config.json, or its names, oldest first
    # one tensor a projection with the experts along its first axis (gpt-oss), not one an expert;
    # gate and up then share one, their rows alternating (gate row i at 2i, up's at 2i + 1)
    fused: bool = False
    # per-expert biases ({tensor}_bias) and the gated activation's settings: numbers, or the
    # config.json key holding one
    biases: bool = False
    activation: dict[str, float | str] | None = None

    def config_keys(self, size: str) -> list[str]:
        keys = self.config[size]
        return [keys] if isinstance(keys, str) else keys

    def tensor_name(self, layer: int, expert: int, projection: str) -> str:
        return self.tensor.format(layer=layer, expert=expert, projection=self.projections[projection])


def architectures() -> dict[str, Architecture]:
    raw = load_toml(data_path("checkpoint_architectures.toml"))
    return {name: Architecture(model_type=name, **fields) for name, fields in raw.items()}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _linear_alternatives(pattern: str) -> str:
    """A weight-name pattern ending in ``weight`` that also matches GPTQ's and AWQ's ``qweight``."""
    head, _, tail = pattern.rpartition("weight")
    return f"{head}(?:weight{tail}|{gptq_awq.QWEIGHT[1:]})" if head else pattern


class Checkpoint:
    def __init__(self, path: str | Path, input_type: str = "auto") -> None:
        self.path = Path(path)
        if input_type != "auto" and input_type not in INPUT_TYPES:
            raise CheckpointError(
                f"input type must be auto or one of {', '.join(INPUT_TYPES)}, got {shown(input_type)}"
            )
        self.input_type = input_type
        config_path = self.path / "config.json"
        if not config_path.exists():
            raise CheckpointError(f"{config_path}: not found (expected a Hugging Face checkpoint directory)")
        try:
            config = read_json(member(self.path, "config.json", str(self.path)), "a config.json")
        except OSError as error:
            raise CheckpointError(f"{config_path}: cannot be read ({error.strerror})") from error
        except ValueError as error:
            raise CheckpointError(str(error)) from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_path}: a JSON {type(config).__name__}, not an object of settings")
        self.config: dict[str, Any] = config
        model_type = str(self.config.get("model_type", ""))
        known = architectures()
        if model_type not in known:
            names = ", ".join(f"{a.label} ({a.model_type})" for a in known.values())
            raise CheckpointError(
                f"{config_path}: model_type {shown(model_type)} is not an MoE architecture ktforge knows; "
                f"supported: {names}"
            )
        self.arch = known[model_type]
        sizes = {}
        self._fields: dict[str, str] = {}
        for key in self.arch.config:
            # a config written by another transformers version may name the size differently
            # (Qwen3-MoE: num_experts on the Hub, num_local_experts from transformers 5)
            keys = self.arch.config_keys(key)
            field = next((name for name in keys if name in self.config), keys[0])
            value = self.config.get(field)
            # bool is an int to Python; `"num_experts": true` is not a size
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value >= 2**31:
                raise CheckpointError(
                    f"{config_path}: {field if field in self.config else ' or '.join(keys)} must be a positive "
                    f"integer below 2^31 for {self.arch.label}, got {shown(value)}"
                )
            sizes[key], self._fields[key] = value, field
        self.hidden, self.intermediate = sizes["hidden"], sizes["intermediate"]
        self.experts, self.top_k = sizes["experts"], sizes["top_k"]
        if self.top_k > self.experts:
            field = self._fields["top_k"]
            raise CheckpointError(
                f"{config_path}: {field} = {self.top_k} routes to more experts than there are ({self.experts})"
            )
        self.fp8_block = self._checked(fp8.block_of, self.config.get("quantization_config"), str(config_path))
        quantization = self.config.get("quantization_config")
        # DeepSeek-V4-Flash: its experts FP4-packed (top-level, or in the quantization config)
        expert_dtype = self.config.get(
            "expert_dtype", quantization.get("expert_dtype") if isinstance(quantization, dict) else None
        )
        self.fp4_experts = expert_dtype == "fp4"
        try:
            self.packed_scheme = ct_packed.scheme_of(quantization, str(config_path)) if quantization else None
            self.linear_scheme = gptq_awq.scheme_of(quantization, str(config_path)) if quantization else None
            self.modelopt_nvfp4 = fp4.is_modelopt_nvfp4(self.config, self.path)
        except ValueError as error:
            raise CheckpointError(str(error)) from None
        self._files: dict[str, SafetensorsFile] = {}
        self._lock = threading.Lock()  # experts are read from several threads
        try:
            self.weight_map = self._weight_map()
            self.moe_layers = self._moe_layers()
        except BaseException:
            self.close()  # the shards read so far
            raise

    # ---- where tensors are ------------------------------------------------------------

    def _weight_map(self) -> dict[str, str]:
        index = self.path / INDEX_NAME
        if index.exists() or index.is_symlink():
            try:
                document = read_json(member(self.path, INDEX_NAME, str(self.path)), "a shard index")
            except OSError as error:
                raise CheckpointError(f"{index}: cannot be read ({error.strerror})") from error
            except ValueError as error:
                raise CheckpointError(f"{error} (not a valid shard index)") from None
            weight_map = document.get("weight_map") if isinstance(document, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
            if any(leaves_directory(shard) for shard in set(weight_map.values())):
                raise CheckpointError(f"{index}: weight_map names a shard outside the checkpoint directory")
            if bad := sorted(repr(shard) for shard in set(weight_map.values()) if not canonical(shard)):
                raise CheckpointError(f"{index}: weight_map's shard {bad[0][:200]} is not a canonical file name")
            return {str(k): v for k, v in weight_map.items()}
        shards = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not shards:
            raise CheckpointError(f"{self.path}: no *.safetensors files and no {INDEX_NAME}")
        return {name: shard for shard in shards for name in self._open(shard).tensors}

    def _open(self, shard: str) -> SafetensorsFile:
        with self._lock:
            if shard not in self._files:
                if not (self.path / shard).exists():
                    raise CheckpointError(f"{self.path / shard}: listed in {INDEX_NAME} but missing")
                try:
                    path = member(self.path, shard, f"{self.path}: shard")
                except UnsafePath as error:
                    raise CheckpointError(str(error)) from None
                self._files[shard] = SafetensorsFile(path)
            return self._files[shard]

    def _moe_layers(self) -> list[int]:
        # a packed weight is stored as {name}_packed, a fused MXFP4 one as {name}_blocks, GPTQ's and
        # AWQ's as {base}.qweight
        packed_suffix = f"(?:{ct_packed.PACKED}|{MXFP4_BLOCKS})?"
        pattern = re.escape(self.arch.tensor_name(0, 0, "gate")).replace(re.escape("layers.0."), r"layers\.(\d+)\.", 1)
        pattern = _linear_alternatives(pattern + packed_suffix)
        layers = sorted({int(m.group(1)) for name in self.weight_map if (m := re.fullmatch(pattern, name))})
        if not layers:
            example = self.arch.tensor_name(0, 0, "gate")
            raise CheckpointError(
                f"{self.path}: no routed expert tensors named like {shown(example)} ({self.arch.label})"
            )
        if self.arch.fused:
            self._check_fused(layers)
            return layers
        # the config's expert count must match the files: fewer would silently drop experts
        template = self.arch.tensor.format(layer=layers[0], expert="EXPERT", projection=self.arch.projections["gate"])
        expert_pattern = _linear_alternatives(re.escape(template).replace("EXPERT", r"(\d+)", 1) + packed_suffix)
        stored = {int(m.group(1)) for name in self.weight_map if (m := re.fullmatch(expert_pattern, name))}
        field = self._fields["experts"]
        if stored and max(stored) >= self.experts:
            raise CheckpointError(
                f"{self.path}: layer {layers[0]} holds expert {max(stored)}, but config.json says {field} = "
                f"{self.experts}; the config does not describe these files"
            )
        if len(stored) != self.experts:  # a config claiming more experts than the files hold
            raise CheckpointError(
                f"{self.path}: config.json says {field} = {self.experts}, but layer {layers[0]} holds {len(stored)} "
                "experts; the config does not describe these files"
            )
        return layers

    def _check_fused(self, layers: list[int]) -> None:
        """Every layer's fused tensors are MXFP4 blocks holding config.json's expert count."""
        for layer in layers:
            for projection in ("gate", "down"):
                name = self.arch.tensor_name(layer, 0, projection)
                if name + MXFP4_BLOCKS not in self.weight_map:
                    raise CheckpointError(
                        f"{self.path}: layer {layer}'s {shown(name)} is not stored as MXFP4 ({name + MXFP4_BLOCKS}); "
                        f"ktforge reads {self.arch.label}'s experts in MXFP4, as released"
                    )
                f, _ = self._tensor(name + MXFP4_BLOCKS, f"layer {layer}, {projection}")
                experts = f.info(name + MXFP4_BLOCKS).shape[0]
                if experts != self.experts:
                    raise CheckpointError(
                        f"{self.path}: config.json says {self._fields['experts']} = {self.experts}, but {shown(name)} "
                        f"holds {experts} experts; the config does not describe these files"
                    )

    def source_identity(self) -> dict[str, Any]:
        """What identifies the source: config and index hashes, each shard's size and header hash
        (the header lists every tensor with its offsets; hashing whole shards would mean reading
        the whole model)."""
        identity: dict[str, Any] = {"config.json": sha256_file(self.path / "config.json")}
        if (self.path / INDEX_NAME).is_file():
            identity[INDEX_NAME] = sha256_file(self.path / INDEX_NAME)
        identity["shards"] = {
            shard: {"bytes": f.size, "header_sha256": hashlib.sha256(f.header_bytes).hexdigest()}
            for shard in sorted(set(self.weight_map.values()))
            for f in [self._open(shard)]
        }
        return identity

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- reading experts ----------------------------------------------------------------

    def shape(self, projection: str) -> tuple[int, int]:
        """[N, K] of one expert's projection."""
        return (self.hidden, self.intermediate) if projection == "down" else (self.intermediate, self.hidden)

    def _stored(self, layer: int, expert: int, projection: str) -> list[tuple[SafetensorsFile, str]]:
        """Where a projection's tensors are: its weight and, quantized, its scales (and INT4's
        shape and zero points)."""
        name = self.arch.tensor_name(layer, expert, projection)
        found = []
        suffixes = dict.fromkeys(
            (*FP8_SCALE_SUFFIXES, *ct_packed.SUFFIXES, MXFP4_BLOCKS, MXFP4_SCALES, fp4.SCALE_2, fp4.GLOBAL_SCALE)
        )
        base = name.removesuffix(".weight")
        siblings = (*(base + s for s in gptq_awq.SUFFIXES), base + SCALE_SIBLING)
        for tensor in (name, *(name + s for s in suffixes), *siblings):
            shard = self.weight_map.get(tensor)
            if shard is not None and tensor in self._open(shard).tensors:
                found.append((self._open(shard), tensor))
        return found

    def source_bytes(self, layer: int, expert: int, projection: str) -> int:
        """Bytes a projection occupies in the checkpoint (with its scales; of a fused tensor, one
        expert's share, gate and up half of theirs each)."""
        total = sum(f.tensors[t].end - f.tensors[t].begin for f, t in self._stored(layer, expert, projection))
        if self.arch.fused:
            total //= self.experts * (2 if projection != "down" else 1)
        return total

    def _tensor(self, name: str, why: str) -> tuple[SafetensorsFile, Array]:
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: tensor {shown(name)} ({why}) is missing")
        f = self._open(shard)
        try:
            return f, f.get(name)
        except SafetensorsError as error:
            raise CheckpointError(str(error)) from error

    def describe(self, layer: int, expert: int, projection: str) -> str:
        name = self.arch.tensor_name(layer, expert, projection)
        candidates = (
            name,
            name + ct_packed.PACKED,
            name + MXFP4_BLOCKS,
            name.removesuffix(".weight") + gptq_awq.QWEIGHT,
        )
        name = next((c for c in candidates if c in self.weight_map), name)
        return f"{self.path / self.weight_map.get(name, '?')}: tensor {shown(name)}"

    def expert(self, layer: int, expert: int, projection: str) -> Stored:
        """One expert's weights [N, K]: bfloat16 and float32 as stored, float16 widened to float32,
        or a quantized format as stored (ktforge.formats.quantize takes each of them)."""
        name = self.arch.tensor_name(layer, expert, projection)
        why = f"layer {layer}, expert {expert}, {projection}"
        if self.arch.fused:
            return self._fused_mxfp4(name, expert, projection, why)
        if name.removesuffix(".weight") + gptq_awq.QWEIGHT in self.weight_map:
            return self._gptq_awq(name.removesuffix(".weight"), projection, why)
        if name not in self.weight_map and name + ct_packed.PACKED in self.weight_map:
            if self.packed_scheme is not None and self.packed_scheme.method == "mxfp4":
                return self._ct_mxfp4(name, projection, why)
            if self.packed_scheme is not None and self.packed_scheme.method == "nvfp4":
                return self._nvfp4(name, ct_packed.PACKED, projection, why)
            return self._int4_groups(name, projection, why)
        f, w = self._tensor(name, f"layer {layer}, expert {expert}, {projection}")
        where = f"{f.path}: tensor {shown(name)}"
        dtype = f.info(name).dtype
        if self.modelopt_nvfp4 and dtype == "U8":
            return self._nvfp4(name, "", projection, why)
        if self.input_type != "auto" and dtype != INPUT_TYPES[self.input_type]:
            raise CheckpointError(f"{where} is {dtype}, but the input type was given as {self.input_type}")
        if w.shape != self.shape(projection) and not (dtype == "I8" and self.fp4_experts):
            raise CheckpointError(
                f"{where} has shape {list(w.shape)}; config.json implies {list(self.shape(projection))}"
            )
        if dtype == "F8_E4M3":
            return self._fp8_blocks(name, where, w)
        if dtype == "I8" and self.fp4_experts:
            return self._fp4_packed(name, projection, where, w)
        if dtype not in ("BF16", "F16", "F32"):
            raise CheckpointError(f"{where} is {dtype}; expected bf16, fp16, fp32 or fp8 (F8_E4M3) weights")
        return w if dtype in ("BF16", "F32") else w.astype(np.float32)

    def stored_method(self, layer: int) -> str | None:
        """The format whose kernels compute the layer's experts as they are stored: "fp8" (FP8
        E4M3), "int4" (packed symmetric INT4 with bfloat16 scales), "int4z" (other packed INT4:
        zero points, float16 or float32 scales), "mxfp4", or None for float weights (its first
        expert's gate tells)."""
        name = self.arch.tensor_name(layer, 0, "gate")
        if self.arch.fused:
            return "mxfp4"
        if name.removesuffix(".weight") + gptq_awq.QWEIGHT in self.weight_map:
            return "int4z"
        if name not in self.weight_map and name + ct_packed.PACKED in self.weight_map:
            scheme = self.packed_scheme
            if scheme is None or scheme.method != "int4":
                return scheme.method if scheme is not None else "int4"
            # int4 holds symmetric groups with bfloat16 scales exactly; int4z any (float32 scales, zero points)
            scale_file, _ = self._tensor(name + ct_packed.SCALE, f"the group scales of {name}")
            bf16 = scale_file.info(name + ct_packed.SCALE).dtype == "BF16"
            exact = scheme.symmetric and bf16 and self.packed_group() in formats.by_name("int4").group_sizes
            return "int4" if exact else "int4z"
        f, _ = self._tensor(name, f"layer {layer}, expert 0, gate")
        dtype = f.info(name).dtype
        if dtype == "U8" and self.modelopt_nvfp4:
            return "nvfp4"
        if dtype == "F8_E4M3":
            return "mxfp8" if self._microscaled(name, *self.shape("gate")) else "fp8"
        return "mxfp4" if dtype == "I8" and self.fp4_experts else None

    def packed_group(self) -> int:
        """The group size packed INT4 is served at: its scheme's, or for the channel strategy (a scale
        a row) the largest of 128, 64 and 32 that divides both K (hidden and intermediate), each
        group taking its row's scale."""
        scheme = self.packed_scheme
        if scheme is not None and scheme.group:
            return scheme.group
        return next((g for g in (128, 64, 32) if self.hidden % g == 0 and self.intermediate % g == 0), 32)

    def _fused_mxfp4(self, name: str, expert: int, projection: str, why: str) -> Mxfp4Groups:
        """One expert's rows of gpt-oss's fused MXFP4 tensors (checkpoints/fp4.py)."""
        f, blocks = self._item(name + MXFP4_BLOCKS, expert, why)
        _, scales = self._item(name + MXFP4_SCALES, expert, f"the scales of {name}")
        where = f"{f.path}: tensor {shown(name + MXFP4_BLOCKS)}"
        return self._checked(fp4.mxfp4_fused, blocks, scales, *self.shape(projection), projection, where)

    def _ct_mxfp4(self, name: str, projection: str, why: str) -> Mxfp4Groups:
        """compressed-tensors' mxfp4-pack-quantized weight (checkpoints/fp4.py)."""
        f, codes = self._tensor(name + ct_packed.PACKED, why)
        scale_file, scale = self._tensor(name + ct_packed.SCALE, f"the scales of {name}")
        dtype = scale_file.info(name + ct_packed.SCALE).dtype
        where = f"{f.path}: tensor {shown(name + ct_packed.PACKED)}"
        return self._checked(fp4.mxfp4_packed, codes, scale, dtype, *self.shape(projection), where)

    @staticmethod
    def _checked(read: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``read(*args)``, its ValueError a CheckpointError."""
        try:
            return read(*args, **kwargs)
        except ValueError as error:
            raise CheckpointError(str(error)) from None

    def _nvfp4(self, name: str, packed: str, projection: str, why: str) -> Nvfp4Groups:
        """An NVFP4 weight: ModelOpt's (``packed`` "": ``{name}``, ``_scale``, ``_scale_2``) or
        compressed-tensors' (``_packed``, ``_scale``, ``_global_scale``), checkpoints/nvfp4.py."""
        f, codes = self._tensor(name + packed, why)
        scale_file, scale = self._tensor(name + "_scale", f"the scales of {name}")
        tensor_name = name + (fp4.GLOBAL_SCALE if packed else fp4.SCALE_2)
        _, tensor_scale = self._tensor(tensor_name, f"the tensor scale of {name}")
        where = f"{f.path}: tensor {shown(name + packed)}"
        dtype = scale_file.info(name + "_scale").dtype
        return self._checked(
            fp4.nvfp4_groups, codes, scale, dtype, tensor_scale, *self.shape(projection), where, inverse=bool(packed)
        )

    def _gptq_awq(self, base: str, projection: str, why: str) -> Int4Groups:
        """One linear layer's GPTQ or AWQ tensors ({base}.qweight, .qzeros, .scales, .g_idx), as int4z
        holds them (gptq_awq)."""
        f, _ = self._tensor(base + gptq_awq.QWEIGHT, why)
        where = f"{f.path}: tensor {shown(base + gptq_awq.QWEIGHT)}"
        scheme = self.linear_scheme
        if scheme is None:
            raise CheckpointError(f"{where}: GPTQ/AWQ tensors, but config.json has no gptq or awq quantization_config")
        tensors = {s: self._tensor(base + s, f"{why}: {s[1:]}")[1] for s in gptq_awq.SUFFIXES[:3]}
        if base + gptq_awq.G_IDX in self.weight_map:
            tensors[gptq_awq.G_IDX] = self._tensor(base + gptq_awq.G_IDX, why)[1]
        N, K = self.shape(projection)
        try:
            codes, scale, zero, order = gptq_awq.unpack(scheme, tensors, N, K)
        except ValueError as error:
            raise CheckpointError(f"{where} ({scheme.method}): {error}") from None
        if not np.isfinite(scale.astype(np.float32)).all():
            raise CheckpointError(f"{where}: its scales hold NaN or infinite values")
        return Int4Groups(codes, scale, scheme.group, K, zero.astype(np.int8) - 8, order)

    def _item(self, name: str, index: int, why: str) -> tuple[SafetensorsFile, Array]:
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: tensor {shown(name)} ({why}) is missing")
        f = self._open(shard)
        try:
            return f, f.get_item(name, index)
        except SafetensorsError as error:
            raise CheckpointError(str(error)) from error

    def biases(self, layer: int) -> tuple[Array, Array, Array] | None:
        """The layer's per-expert biases, float32 gate, up [E, I] and down [E, H], where the
        architecture has them (gpt-oss's ``{tensor}_bias``, gate and up interleaved)."""
        if not self.arch.biases:
            return None
        fused = [
            self._tensor(self.arch.tensor_name(layer, 0, p) + "_bias", f"layer {layer}'s {p} biases")[1]
            for p in ("gate", "down")
        ]
        gate_up, down = (np.asarray(b, dtype=np.float32) for b in fused)
        if gate_up.shape != (self.experts, 2 * self.intermediate) or down.shape != (self.experts, self.hidden):
            raise CheckpointError(
                f"{self.path}: layer {layer}'s biases are {list(gate_up.shape)} and {list(down.shape)}; config.json "
                f"implies {[self.experts, 2 * self.intermediate]} and {[self.experts, self.hidden]}"
            )
        return gate_up[:, 0::2].copy(), gate_up[:, 1::2].copy(), down

    def activation(self) -> dict[str, float]:
        """The gated activation's settings (MoE's swiglu_alpha, swiglu_limit, up_offset) as the
        architecture defines them, values named by a config.json key read from it."""
        settings = {}
        for key, value in (self.arch.activation or {}).items():
            number = self.config.get(value) if isinstance(value, str) else value
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise CheckpointError(f"{self.path / 'config.json'}: {value} must be a number, got {shown(number)}")
            settings[key] = float(number)
        return settings

    def _int4_groups(self, name: str, projection: str, why: str) -> Int4Groups:
        f, packed = self._tensor(name + ct_packed.PACKED, why)
        where = f"{f.path}: tensor {shown(name + ct_packed.PACKED)}"
        if self.packed_scheme is None:
            raise CheckpointError(f"{where}: packed weights, but config.json has no pack-quantized quantization_config")
        if self.input_type != "auto":
            raise CheckpointError(f"{where} is packed INT4, but the input type was given as {self.input_type}")
        N, K = self.shape(projection)
        _, shape = self._tensor(name + ct_packed.SHAPE, f"the shape of {name}")
        if [int(v) for v in np.asarray(shape).reshape(-1)] != [N, K]:
            raise CheckpointError(f"{where}: its {ct_packed.SHAPE} is {shape.tolist()}; config.json implies {[N, K]}")
        if f.info(name + ct_packed.PACKED).dtype != "I32" or packed.shape != (N, -(-K // 8)):
            raise CheckpointError(
                f"{where} is {f.info(name + ct_packed.PACKED).dtype} {list(packed.shape)}; "
                f"4-bit values of [{N}, {K}] pack into I32 {[N, -(-K // 8)]}"
            )
        group = self.packed_scheme.group or K
        scale_file, scale = self._tensor(name + ct_packed.SCALE, f"the group scales of {name}")
        groups = [N, -(-K // group)]
        if list(scale.shape) != groups:
            raise CheckpointError(
                f"{where}: {ct_packed.SCALE} has shape {list(scale.shape)}; groups of {group} need {groups}"
            )
        dtype = scale_file.info(name + ct_packed.SCALE).dtype
        if dtype not in ("BF16", "F16", "F32") or not np.isfinite(scale.astype(np.float32)).all():
            raise CheckpointError(f"{where}: {ct_packed.SCALE} must hold finite floats, got {dtype}")
        zero = None
        if not self.packed_scheme.symmetric:
            _, packed_zero = self._tensor(name + ct_packed.ZERO_POINT, f"the zero points of {name}")
            if packed_zero.shape != (-(-N // 8), groups[1]):
                raise CheckpointError(
                    f"{where}: {ct_packed.ZERO_POINT} has shape {list(packed_zero.shape)}; "
                    f"expected {[-(-N // 8), groups[1]]}"
                )
            zero = ct_packed.zero_points(packed_zero, N, groups[1])
        if not self.packed_scheme.group:  # channel strategy: its scale (and zero) in each group of a size served
            group = self.packed_group()
            scale = np.repeat(np.asarray(scale), -(-K // group), axis=1)
            zero = None if zero is None else np.repeat(zero, -(-K // group), axis=1)
        return Int4Groups(ct_packed.codes(packed, N, K, group), np.asarray(scale), group, K, zero)

    def _scale_name(self, name: str) -> str:
        """The scales of weight ``name``: DeepSeek-V3's and transformers' weight_scale_inv,
        compressed-tensors' weight_scale, or DeepSeek-V4's sibling ``.scale``."""
        candidates = (*(name + s for s in FP8_SCALE_SUFFIXES), name.removesuffix(".weight") + SCALE_SIBLING)
        return next((c for c in candidates if c in self.weight_map), candidates[0])

    def _fp4_packed(self, name: str, projection: str, where: str, w: Array) -> Mxfp4Groups:
        """DeepSeek-V4-Flash's FP4 experts: I8 codes with F8_E8M0 scales (checkpoints/fp4.py)."""
        scale_name = self._scale_name(name)
        scale_file, scale = self._tensor(scale_name, f"the scales of {name}")
        dtype = scale_file.info(scale_name).dtype
        if dtype != "F8_E8M0" or w.dtype != np.int8:
            raise CheckpointError(f"{where} is FP4-packed {w.dtype} with {dtype} scales; DeepSeek-V4's: I8, F8_E8M0")
        return self._checked(fp4.mxfp4_packed, w, scale, dtype, *self.shape(projection), where)

    def _microscaled(self, name: str, N: int, K: int) -> bool:
        """Whether FP8 weight ``name`` [N, K] has MXFP8's scales: an E8M0 code (U8, as MiniMax-M3 and
        compressed-tensors store them, or F8_E8M0) per row and 32 values."""
        scale_name = self._scale_name(name)
        if scale_name not in self.weight_map:
            return False
        info = self._open(self.weight_map[scale_name]).info(scale_name)
        return info.dtype in ("U8", "F8_E8M0") and tuple(info.shape) == (N, -(-K // 32))

    def _fp8_blocks(self, name: str, where: str, w: Array) -> Fp8Blocks | Mxfp8Groups:
        scale_name = self._scale_name(name)
        if self._microscaled(name, *w.shape):  # E4M3 codes with E8M0 scales per 32: MXFP8, as it is
            _, e8m0 = self._tensor(scale_name, f"the MXFP8 scales of {name}")
            return self._checked(fp8.microscaled, w, e8m0, f"{where} (MXFP8)", scale_name)
        scale_file, scale = self._tensor(scale_name, f"the block scales of {name}")
        dtype = scale_file.info(scale_name).dtype
        return self._checked(fp8.blocks, w, scale, dtype, self.fp8_block, f"{where}: {scale_name}")
