"""GGUF files as llama.cpp writes them: the header, the metadata, the tensor directory and each
tensor's bytes, read from a memory map (nothing is copied until a caller asks). A model split
into ``NAME-00001-of-0000K.gguf`` files, or a directory holding one model, reads as one.

The format (llama.cpp's gguf.h, little endian): "GGUF", version 2 or 3, the tensor and key
counts (u64), the key/value pairs, then per tensor its name, dimensions (ne[0] first: the
contiguous one), ggml type and offset into the data, which starts at the next multiple of
``general.alignment`` (32 by default).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ktforge.resources import data_path

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
# value types: struct code, or one of the two that are not fixed-size
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """A file that is not a GGUF this reader understands, saying what and where."""


@dataclass(frozen=True)
class GgmlType:
    name: str
    id: int
    block_values: int
    block_bytes: int
    served_as: str | None  # the format that keeps its values exactly; None: refused
    why: str


@cache
def ggml_types() -> dict[int, GgmlType]:
    rows = json.loads(data_path("gguf_types.json").read_text())["types"]
    return {r["id"]: GgmlType(r["name"], r["id"], r["block"][0], r["block"][1], r["served_as"], r["why"]) for r in rows}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy's order: the contiguous dimension last (GGUF's ne reversed)
    type: GgmlType
    offset: int  # from the start of the file
    nbytes: int
    file: Path


class _Cursor:
    def __init__(self, view: memoryview, path: Path) -> None:
        self.view, self.pos, self.path = view, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.view):
            raise GgufError(f"{self.path}: truncated at byte {self.pos} (the header or metadata is cut short)")
        (value,) = struct.unpack_from("<" + fmt, self.view, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.take("Q")
        if self.pos + length > len(self.view):
            raise GgufError(f"{self.path}: a string of {length} bytes runs past the end of the file")
        text = bytes(self.view[self.pos : self.pos + length]).decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == _ARRAY or count > len(self.view):
                raise GgufError(f"{self.path}: an array of {count} values of type {item} cannot be read")
            return [self.value(item) for _ in range(count)]
        raise GgufError(f"{self.path}: unknown metadata value type {kind} at byte {self.pos}")


class GgufFile:
    """One .gguf file: ``metadata`` (key -> value) and ``tensors`` (name -> TensorInfo)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self.path.open("rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(self._map)
        try:
            self._read(view)
        finally:
            view.release()

    def _read(self, view: memoryview) -> None:
        if bytes(view[:4]) != MAGIC:
            raise GgufError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        cursor = _Cursor(view, self.path)
        cursor.pos = 4
        version = cursor.take("I")
        if version not in (2, 3):
            raise GgufError(f"{self.path}: GGUF version {version}; this reader takes versions 2 and 3")
        tensor_count, kv_count = cursor.take("Q"), cursor.take("Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            self.metadata[key] = cursor.value(cursor.take("I"))
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [cursor.take("Q") for _ in range(cursor.take("I"))]
            infos.append((name, tuple(reversed(dims)), cursor.take("I"), cursor.take("Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-cursor.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        types = ggml_types()
        for name, shape, type_id, offset in infos:
            if type_id not in types:
                raise GgufError(f"{self.path}: tensor {name} has ggml type {type_id}, which this reader does not know")
            kind = types[type_id]
            if shape and shape[-1] % kind.block_values:
                raise GgufError(f"{self.path}: tensor {name}'s rows ({shape[-1]}) are not whole {kind.name} blocks")
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            nbytes = count // kind.block_values * kind.block_bytes
            if start + offset + nbytes > len(self._map):
                raise GgufError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")
            self.tensors[name] = TensorInfo(name, shape, kind, start + offset, nbytes, self.path)

    def data(self, info: TensorInfo) -> np.ndarray[Any, Any]:
        """The tensor's bytes, uint8 ``[..., rows, blocks a row * block bytes]``, read-only, mapped."""
        flat = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        row = info.shape[-1] // info.type.block_values * info.type.block_bytes if info.shape else info.nbytes
        return flat.reshape(*info.shape[:-1], row)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # arrays still view the map: it closes when they are gone
            self._map.close()


def model_files(path: str | Path) -> list[Path]:
    """The files of the model at ``path``: the file itself, all the parts of a split model (from
    any part), or the one model a directory holds (one .gguf, or the parts of one split)."""
    target = Path(path)
    if target.is_dir():
        found = sorted(target.glob("*.gguf"))
        firsts = [p for p in found if (m := SPLIT_NAME.match(p.name)) and int(m["index"]) == 1]
        whole = [p for p in found if not SPLIT_NAME.match(p.name)]
        if len(firsts) + len(whole) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise GgufError(f"{target} holds {len(firsts) + len(whole)} GGUF models ({names}); pass the file to load")
        target = (firsts + whole)[0]
    if not target.is_file():
        raise GgufError(f"{target}: no such GGUF file")
    match = SPLIT_NAME.match(target.name)
    if match is None:
        return [target]
    count = int(match["count"])
    parts = [target.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GgufError(f"{target} is part of a split model whose parts {', '.join(missing)} are missing")
    return parts


class GgufModel:
    """A model's GGUF files as one: the first file's metadata, every file's tensors."""

    def __init__(self, path: str | Path) -> None:
        self.files = [GgufFile(p) for p in model_files(path)]
        self.path = self.files[0].path
        self.metadata = self.files[0].metadata
        self.tensors: dict[str, TensorInfo] = {}
        for part in self.files:
            self.tensors.update(part.tensors)
        self._by_path = {part.path: part for part in self.files}

    def data(self, name: str) -> np.ndarray[Any, Any]:
        info = self.tensors[name]
        return self._by_path[info.file].data(info)

    def close(self) -> None:
        for part in self.files:
            part.close()

    def __enter__(self) -> GgufModel:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
