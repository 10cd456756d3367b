"""`kt convert`: a Hugging Face checkpoint's routed experts, quantized into ktforge's format.

Output directory (format ``ktforge-moe-experts``, version 1):
- ``layer-NNN.safetensors``, one per MoE layer: tensors ``{gate,up,down}.weight`` and, for
  int8/int4, ``{gate,up,down}.scale``, each with the experts as the first axis and the
  portable layout of :mod:`ktforge.formats.quantize` after it; where the experts compute biases
  (gpt-oss), ``{gate,up,down}.bias`` in float32, as the checkpoint holds them. Nothing depends
  on thread or NUMA counts: the kernels pack the weights for themselves at load.
- ``manifest.json``: format and version, method, group size, the layer's sizes, the gated
  activation where it is not plain SwiGLU (``activation``: gpt-oss's alpha, limit and up + 1,
  DeepSeek-V4's clamp), the source
  (config/index hashes, each shard's size and header hash) and every tensor's dtype, shape
  and SHA-256. It is written last, atomically: a directory without it is not a conversion.
- while converting, ``.ktforge-convert.json`` records the finished layers; running the same
  command again after an interruption skips them. Layer files appear only when complete
  (written as ``*.partial``, fsynced, renamed).

Memory stays bounded by a few experts: each is read (pread, tensor by tensor), quantized and written
into its place in the layer file before the next.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ktforge import __version__, formats
from ktforge.checkpoints import fingerprint
from ktforge.checkpoints.checkpoint import PROJECTIONS, Checkpoint, CheckpointError
from ktforge.checkpoints.safetensors_io import SafetensorsError, SafetensorsFile, StreamingWriter, as_bytes
from ktforge.files import UnsafePath, member, read_json, shown
from ktforge.formats.quantize import METHODS, Quantized, Stored, quantize, shapes, stored_rows
from ktforge.resources import shared_file_mode, write_atomic

Array = np.ndarray[Any, Any]
ACTIVATION_KEYS = ("swiglu_alpha", "swiglu_limit", "up_offset")  # MoE's gated-activation arguments
FORMAT = "ktforge-moe-experts"
FORMAT_VERSION = 3  # 3: biases and the activation kept; 2: int4 group scales are bfloat16 (float32 in 1)
# Older versions still read, with the methods whose layout has not changed since (a version 2
# conversion is of a checkpoint without biases or another activation: version 2 refused those).
READS_OLDER = {1: ("bf16", "int8"), 2: METHODS}
BIASES = ("gate.bias", "up.bias", "down.bias")
MANIFEST = "manifest.json"
STATE = ".ktforge-convert.json"
LOCK = ".ktforge-convert.lock"


class ConversionError(ValueError):
    """The conversion cannot start or continue; the message says why and what to do."""


@dataclass(frozen=True)
class Options:
    method: str
    group_size: int
    input_type: str
    # a checkpoint's own INT4 kept as it is, or an error (see quantize); not in the manifest
    exact: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "group_size": self.group_size if formats.by_name(self.method).grouped else None,
            "input_type": self.input_type,
        }


def layer_file(layer: int) -> str:
    return f"layer-{layer:03d}.safetensors"


def parse_layers(spec: str | None, available: list[int]) -> list[int]:
    """``None`` or ``all``: every MoE layer; else ``3``, ``0-5``, ``1,4,7-9``."""
    if spec is None or spec.strip() in ("", "all"):
        return list(available)
    chosen: set[int] = set()
    for part in spec.split(","):
        bounds = part.strip().split("-")
        try:
            low, high = (int(bounds[0]), int(bounds[-1])) if len(bounds) <= 2 else (0, -1)
        except ValueError:
            low, high = 0, -1
        if high < low:
            raise ConversionError(
                f"--layers: cannot read {shown(_clip(part.strip()))} (use forms like 3, 0-5 or 1,4,7-9)"
            )
        if low < 0 or high > max(available):  # before expanding it: 0-100000000000 is a typo, not a plan
            raise ConversionError(
                f"--layers: {_clip(part.strip())} goes beyond the model's layers; MoE layers are "
                f"{format_layers(available)}"
            )
        chosen.update(range(low, high + 1))
    missing = sorted(chosen - set(available))
    if missing:
        raise ConversionError(
            f"--layers: layer(s) {_clip(format_layers(missing))} hold no routed experts; "
            f"MoE layers are {format_layers(available)}"
        )
    return sorted(chosen)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def format_layers(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ",".join(out)


def layer_tensors(
    method: str, experts: int, hidden: int, intermediate: int, group: int, biases: bool = False
) -> dict[str, tuple[str, tuple[int, ...]]]:
    tensors = {}
    for projection in PROJECTIONS:
        N, K = (hidden, intermediate) if projection == "down" else (intermediate, hidden)
        for part, (shape, dtype) in shapes(method, N, K, group).items():
            tensors[f"{projection}.{part}"] = (dtype, (experts, *shape))
        if biases:
            tensors[f"{projection}.bias"] = ("F32", (experts, N))
    return tensors


Sink = Callable[[int, str, Quantized], None]


def quantized_experts(
    checkpoint: Checkpoint,
    layer: int,
    options: Options,
    threads: int,
    sink: Sink,
    source: Callable[[int, str, Stored], None] | None = None,
) -> Generator[tuple[int, dict[str, Quantized], int], None, None]:
    """Quantizes a layer's experts on ``threads`` threads, a few experts in flight (the
    extension and NumPy release the GIL); ``sink(expert, projection, q)`` runs on the worker
    (writing its slice). Yields (expert, its projections, source bytes read) in expert order;
    an expert's source pages are dropped when the caller asks for the next one."""

    def one(expert: int) -> tuple[dict[str, Quantized], int]:
        out, read = {}, 0
        for projection in PROJECTIONS:
            w = checkpoint.expert(layer, expert, projection)
            if source is not None:
                source(expert, projection, w)
            read += checkpoint.source_bytes(layer, expert, projection)
            try:
                q = quantize(w, options.method, options.group_size, exact=options.exact)
            except ValueError as error:
                raise CheckpointError(f"{checkpoint.describe(layer, expert, projection)}: {error}") from error
            sink(expert, projection, q)
            out[projection] = q
        return out, read

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        pending: deque[Future[tuple[dict[str, Quantized], int]]] = deque()
        next_expert = 0
        try:
            for expert in range(checkpoint.experts):
                while next_expert < checkpoint.experts and len(pending) < 2 * max(1, threads):
                    pending.append(pool.submit(one, next_expert))
                    next_expert += 1
                projections, read = pending.popleft().result()
                yield expert, projections, read
        finally:
            # stopped early (an error, an interrupt): queued experts are dropped, and leaving
            # the pool waits for the running ones, so nothing writes after the caller moves on
            for future in pending:
                future.cancel()


def convert_layer(
    checkpoint: Checkpoint, layer: int, options: Options, path: Path, threads: int, advance: Callable[[int], None]
) -> dict[str, Any]:
    """Writes one layer file; returns its manifest entry (tensors with SHA-256, bytes)."""
    biases = checkpoint.biases(layer)  # small ([E, I] and [E, H]): read whole, checked first
    for name, bias in zip(BIASES, biases or (), strict=False):
        if not np.isfinite(bias).all():
            raise ConversionError(f"{checkpoint.path}: layer {layer}'s {name.split('.')[0]} biases hold NaN or Inf")
    tensors = layer_tensors(
        options.method,
        checkpoint.experts,
        checkpoint.hidden,
        checkpoint.intermediate,
        options.group_size,
        biases is not None,
    )
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "layer": str(layer),
        **{k: str(v) for k, v in options.as_dict().items()},
    }
    writer = StreamingWriter(path, tensors, metadata)
    digests = {name: hashlib.sha256() for name in tensors}

    def write(expert: int, projection: str, q: Quantized) -> None:
        for part, array in q.parts().items():
            writer.write(f"{projection}.{part}", expert, array)

    # the fingerprint's rows of the source weights, every expert's, taken as the experts stream past
    samples: dict[tuple[int, str], Array] = {}

    def keep_sample(expert: int, projection: str, w: Stored) -> None:
        samples[expert, projection] = stored_rows(w, fingerprint.sampled)

    try:
        # slices are written by the workers; the checksums need them in order, here
        with closing(quantized_experts(checkpoint, layer, options, threads, write, keep_sample)) as experts:
            for _, projections, read in experts:
                for projection, q in projections.items():
                    for part, array in q.parts().items():
                        digests[f"{projection}.{part}"].update(as_bytes(array))
                advance(read)
        for name, bias in zip(BIASES, biases or (), strict=False):
            for expert in range(checkpoint.experts):
                writer.write(name, expert, bias[expert])
            digests[name].update(as_bytes(np.ascontiguousarray(bias)))
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "fingerprint": fingerprint.record(checkpoint.experts, lambda e, p: samples[e, p]),
        "tensors": {
            name: {"dtype": dtype, "shape": list(shape), "sha256": digests[name].hexdigest()}
            for name, (dtype, shape) in tensors.items()
        },
    }


def _write_json(path: Path, document: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(document, indent=1, sort_keys=True) + "\n").encode(), mode=shared_file_mode())


class OutputBusy(ConversionError):
    """Another conversion holds the output directory's lock."""


def _lock_output(output: Path) -> int:
    """The output directory's lock (one writer per directory), held until the fd is closed."""
    output.mkdir(parents=True, exist_ok=True)
    fd = os.open(output / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        os.close(fd)
        raise OutputBusy(
            f"another kt convert{f' (process {holder})' if holder.isdigit() else ''} is writing into {output}; "
            "wait for it to finish and run this command again, or choose another --output"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


@dataclass
class Plan:
    checkpoint: Checkpoint
    options: Options
    output: Path
    layers: list[int]
    done: dict[str, Any]  # layer (as a string) -> manifest entry, finished earlier
    header: dict[str, Any]  # what the manifest says besides the layers
    lock: int = -1  # the output directory's lock (a file descriptor), held while the plan lives

    def close(self) -> None:
        self.checkpoint.close()
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def todo(self) -> list[int]:
        return [layer for layer in self.layers if str(layer) not in self.done]

    def source_bytes(self, layer: int) -> int:
        return sum(
            self.checkpoint.source_bytes(layer, e, p) for e in range(self.checkpoint.experts) for p in PROJECTIONS
        )


def _identity(source: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in source.items() if key != "path"}  # a moved checkpoint is the same


def plan(input_dir: Path, output: Path, method: str, group_size: int, input_type: str, layers: str | None) -> Plan:
    """Checks everything that can be checked before writing; finds what an earlier run finished."""
    if method not in METHODS:
        raise ConversionError(f"--quant must be one of {', '.join(METHODS)}, got {shown(method)}")
    f = formats.by_name(method)
    if f.super_block is not None or f.element in ("fp8", "int4z", "iq4nl", "q40", "q41", "q50", "q51"):
        raise ConversionError(
            f"--quant {method}: a checkpoint in it needs no conversion, MoE.from_pretrained(checkpoint, layer) serves "
            "its experts as they are; kt convert writes the smaller formats (int8, int8g, int4, mxfp4) or bf16"
        )
    group_size = formats.group_for(method, group_size)  # mxfp4's 32, whatever the default
    try:
        formats.check_group(method, group_size, option="--group-size")
    except ValueError as error:
        raise ConversionError(str(error)) from None
    if output.resolve() == input_dir.resolve():
        raise ConversionError("--output must not be the input checkpoint directory")
    for parent in (output, *output.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ConversionError(f"--output {output}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConversionError(f"--output {output}: {parent} is not writable")
            break
    checkpoint = Checkpoint(input_dir, input_type)
    try:
        options = Options(method, group_size if formats.by_name(method).grouped else 0, input_type)
        chosen = parse_layers(layers, checkpoint.moe_layers)
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **options.as_dict(),
            "architecture": checkpoint.arch.model_type,
            "hidden_size": checkpoint.hidden,
            "intermediate_size": checkpoint.intermediate,
            "num_experts": checkpoint.experts,
            "top_k": checkpoint.top_k,
            "activation": checkpoint.activation(),  # {}: SwiGLU
            "biases": bool(checkpoint.arch.biases),
            "source": {"path": str(input_dir.resolve()), **checkpoint.source_identity()},
        }
        lock = _lock_output(output)  # from here to the end of the run: what is read stays true
        result = Plan(checkpoint, options, output, chosen, {}, header, lock)
    except BaseException:
        checkpoint.close()
        raise
    try:
        result.done = _finished_layers(output, header)
    except BaseException:
        result.close()
        raise
    return result


def _finished_layers(output: Path, header: dict[str, Any]) -> dict[str, Any]:
    """Layers an earlier run of the same conversion finished (in its manifest or state file)."""
    done: dict[str, Any] = {}
    for existing in (MANIFEST, STATE):
        path = output / existing
        if not (path.exists() or path.is_symlink()):
            continue
        previous = _read_conversion_json(path, "remove it or choose another --output")
        differences = [
            f"{key}: {_clip(repr(previous.get(key)))} there, {shown(value)} now"
            for key, value in header.items()
            if key != "source" and previous.get(key) != value
        ]
        if _identity(previous.get("source", {})) != _identity(header["source"]):
            differences.append("source checkpoint: different files (hashes differ)")
        if differences:
            raise ConversionError(
                f"{output} holds {'a conversion' if existing == MANIFEST else 'an unfinished conversion'} made "
                f"differently ({'; '.join(differences)}); choose another --output or remove it"
            )
        for key, entry in previous["layers"].items():
            try:
                file = member(output, entry["file"], str(path))
            except UnsafePath:
                continue  # converted again
            if file.stat().st_size == entry["bytes"]:
                done[key] = entry
    return done


def run(plan: Plan, threads: int, on_progress: Callable[[int, int, str], None]) -> dict[str, Any]:
    """Converts the plan's remaining layers and writes the manifest; returns it.

    ``on_progress(bytes_done, layers_done, label)`` is called as source bytes are consumed.
    """
    if plan.lock < 0:
        raise ConversionError(f"{plan.output}: this plan was closed; plan the conversion again")
    if not plan.todo and (plan.output / MANIFEST).is_file():
        return read_manifest(plan.output)  # nothing to add to a finished conversion
    # An interrupted run's temporary files (the lock says no other run is writing): only the
    # names this conversion writes, never a file it did not create.
    for name in [layer_file(layer) for layer in plan.layers] + [MANIFEST, STATE]:
        for stale in [plan.output / (name + ".partial"), *plan.output.glob(f".{name}.*.partial")]:
            stale.unlink(missing_ok=True)
    layers = {key: plan.done[key] for key in sorted(plan.done, key=int)}
    state = {**plan.header, "layers": layers}
    _write_json(plan.output / STATE, state)
    # A finished conversion's manifest stays until the new one replaces it (atomically, at
    # the end): a rerun over more layers that fails leaves the old conversion loadable.
    bytes_done, finished = 0, len([layer for layer in plan.layers if str(layer) in plan.done])
    for layer in plan.todo:
        label = f"layer {layer}"
        on_progress(bytes_done, finished, label)

        def advance(read: int, finished: int = finished, label: str = label) -> None:
            nonlocal bytes_done
            bytes_done += read
            on_progress(bytes_done, finished, label)

        layers[str(layer)] = convert_layer(
            plan.checkpoint, layer, plan.options, plan.output / layer_file(layer), threads, advance
        )
        finished += 1
        _write_json(plan.output / STATE, state)
        on_progress(bytes_done, finished, label)
    manifest = {**plan.header, "created_by": f"ktforge {__version__}", "layers": layers}
    _write_json(plan.output / MANIFEST, manifest)
    (plan.output / STATE).unlink()
    return manifest


# ---- reading a conversion back -------------------------------------------------------------


def _read_conversion_json(path: Path, remedy: str) -> dict[str, Any]:
    """A manifest or state file, its structure checked: what later code indexes is there."""
    try:
        document = read_json(member(path.parent, path.name, str(path.parent)), "a ktforge manifest")
    except OSError as error:
        raise ConversionError(f"{path}: unreadable ({error.strerror}); {remedy}") from error
    except ValueError as error:
        raise ConversionError(f"{error}; {remedy}") from None
    problem = _manifest_problem(document)
    if problem:
        raise ConversionError(f"{path}: damaged ({problem}); {remedy}")
    result: dict[str, Any] = document
    return result


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _manifest_problem(document: object) -> str | None:
    if not isinstance(document, dict):
        return "not a JSON object"
    layers = document.get("layers")
    if not isinstance(layers, dict):
        return '"layers" is not an object'
    for key, entry in layers.items():
        if not key.isdigit() or len(key) > 9:
            return f"layer key {shown(_clip(key))} is not a layer number"
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not _is_size(entry.get("bytes")):
            return f"layer {key} has no file name and size"
        tensors = entry.get("tensors")
        if not isinstance(tensors, dict) or not all(
            isinstance(t, dict)
            and isinstance(t.get("dtype"), str)
            and isinstance(t.get("sha256"), str)
            and isinstance(t.get("shape"), list)
            and all(_is_size(n) for n in t["shape"])
            for t in tensors.values()
        ):
            return f"layer {key}'s tensors are not described by dtype, shape and sha256"
    for size in ("hidden_size", "intermediate_size", "num_experts", "top_k"):
        if size in document and not (_is_size(document[size]) and 0 < document[size] < 2**31):
            return f"{size} is not a positive size below 2^31"
    activation = document.get("activation", {})
    if not isinstance(activation, dict) or not all(
        key in ACTIVATION_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for key, v in activation.items()
    ):
        return f"its activation is not finite numbers named {', '.join(ACTIVATION_KEYS)}"
    method = document.get("method", "bf16")
    if method not in METHODS or document.get("group_size") not in (None, 0, *formats.by_name(method).group_sizes):
        return "its method or group size is not one ktforge computes"
    return None


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not (path.exists() or path.is_symlink()):
        if (directory / STATE).is_file():
            raise ConversionError(
                f"{directory}: the conversion is unfinished (no {MANIFEST}); run the same `kt convert` command "
                "again to finish it"
            )
        raise ConversionError(f"{directory}: no {MANIFEST} (not a ktforge conversion)")
    manifest = _read_conversion_json(path, "convert again")
    if manifest.get("format") != FORMAT:
        raise ConversionError(f"{path}: format {_clip(repr(manifest.get('format')))} is not {shown(FORMAT)}")
    version = manifest.get("format_version")
    older = READS_OLDER.get(version) if type(version) is int else None  # a damaged one may be a list
    if version != FORMAT_VERSION and (older is None or manifest.get("method") not in older):
        raise ConversionError(
            f"{path}: format version {_clip(repr(version))}{' with float32 int4 scales' if older else ''}; "
            f"this ktforge reads version {FORMAT_VERSION} (convert again with this version)"
        )
    for size in ("hidden_size", "intermediate_size", "num_experts", "top_k"):
        if size not in manifest:
            raise ConversionError(f"{path}: damaged ({size} is missing); convert again")
    if "method" not in manifest:
        raise ConversionError(f"{path}: damaged (method is missing); convert again")
    return manifest


def load_layer(
    directory: Path, layer: int, verify: bool = True
) -> tuple[dict[str, Any], dict[str, Quantized], tuple[Array, Array, Array] | None]:
    """The manifest, one converted layer's projections and its biases (gate, up, down; None: the
    experts have none), checksums verified."""
    manifest = read_manifest(directory)
    entry = manifest["layers"].get(str(layer))
    if entry is None:
        raise ConversionError(
            f"{directory}: layer {layer} was not converted; converted layers: "
            f"{format_layers(sorted(map(int, manifest['layers'])))}"
        )
    try:
        path = member(directory, entry["file"], str(directory / MANIFEST))
        f = SafetensorsFile(path)
    except (UnsafePath, SafetensorsError) as error:
        raise ConversionError(str(error)) from error
    with f:
        arrays = {}
        for name, expected in entry["tensors"].items():
            if name not in f.tensors:
                raise ConversionError(f"{path}: tensor {shown(name)} is missing")
            info = f.tensors[name]
            if info.dtype != expected["dtype"] or list(info.shape) != expected["shape"]:
                raise ConversionError(
                    f"{path}: tensor {shown(name)} is {info.dtype} {list(info.shape)}; the manifest says "
                    f"{expected['dtype']} {expected['shape']}"
                )
            if verify and hashlib.sha256(f.raw(name)).hexdigest() != expected["sha256"]:
                raise ConversionError(f"{path}: tensor {shown(name)} does not match its checksum (the file is corrupt)")
            arrays[name] = f.get(name)
    projections = {p: Quantized.named(arrays, p) for p in PROJECTIONS}
    if manifest.get("biases") and not all(name in arrays for name in BIASES):
        raise ConversionError(f"{path}: the manifest says the experts have biases; the layer holds none")
    biases = (arrays["gate.bias"], arrays["up.bias"], arrays["down.bias"]) if manifest.get("biases") else None
    return manifest, projections, biases
