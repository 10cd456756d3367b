"""GGUF files as llama.cpp writes them: the header, the metadata, the tensor directory and each
tensor's bytes, read through the file descriptor (never a memory map: a file cut short while it
is read is an error naming it, not SIGBUS). A model split into ``NAME-00001-of-0000K.gguf``
files, or a directory holding one model, reads as one.

The format (llama.cpp's gguf.h, little endian): "GGUF", version 2 or 3, the tensor and key
counts (u64), the key/value pairs, then per tensor its name, dimensions (ne[0] first: the
contiguous one), ggml type and offset into the data, which starts at the next multiple of
``general.alignment`` (32 by default). Checked as llama.cpp's gguf_init_from_file_impl checks
it, or more: no key or tensor twice, the alignment a nonzero power of two, at most 4 dimensions
whose product does not wrap, each tensor at its running offset (aligned, no overlap, no gap) and
inside the file; across a split model's parts, split.no / split.count / split.tensors.count
agree with the names and with each other, and no tensor is in two parts.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ktforge.files import UnsafePath, member, open_regular, shown
from ktforge.resources import data_path

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
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
    block_values: int  # 0: a size this reader cannot compute (an id ggml removed, or not ggml's)
    block_bytes: int
    served_as: str | None  # the format that keeps its values exactly; None: refused
    why: str

    @property
    def sized(self) -> bool:
        return self.block_values > 0


@cache
def ggml_types() -> dict[int, GgmlType]:
    """Every id of ggml's ggml_type (data/gguf_types.json), removed ones included."""
    rows = json.loads(data_path("gguf_types.json").read_text())["types"]
    types = {}
    for r in rows:
        values, size = r["block"] or (0, 0)
        types[r["id"]] = GgmlType(r["name"], r["id"], values, size, r["served_as"], r["why"])
    return types


def ggml_type(type_id: int) -> GgmlType:
    """The type of id ``type_id``; one past ggml's ids is named as not ggml's (a fork's own)."""
    known = ggml_types()
    if type_id in known:
        return known[type_id]
    return GgmlType(
        f"type id {type_id}",
        type_id,
        0,
        0,
        None,
        f"it is not one of ggml's types (ids 0-{max(known)}): a fork's own type (ik_llama.cpp's IQ2_K and the like) "
        "that llama.cpp does not read either",
    )


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy's order: the contiguous dimension last (GGUF's ne reversed)
    type: GgmlType
    offset: int  # from the start of the file
    nbytes: int
    file: Path


class _Cursor:
    """The header, read through the descriptor a chunk at a time as far as the parse needs."""

    def __init__(self, fd: int, size: int, path: Path) -> None:
        self.fd, self.size, self.path, self.pos, self.buf = fd, size, path, 0, bytearray()

    def _need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise GgufError(f"{self.path}: {what} at byte {self.pos} runs past the end of the file (truncated?)")
        while len(self.buf) < self.pos + n:
            chunk = os.pread(self.fd, max(1 << 16, self.pos + n - len(self.buf)), len(self.buf))
            if not chunk:
                raise GgufError(f"{self.path}: cut short at byte {len(self.buf)} while it was read")
            self.buf += chunk

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        self._need(size, "the header or metadata")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = self.take("Q")
        self._need(length, f"a string of {length} bytes")
        text = bytes(self.buf[self.pos : self.pos + length]).decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == _ARRAY or count > self.size:
                raise GgufError(f"{self.path}: an array of {count} values of type {item} cannot be read")
            return [self.value(item) for _ in range(count)]
        raise GgufError(f"{self.path}: unknown metadata value type {kind} at byte {self.pos}")


class GgufFile:
    """One .gguf file: ``metadata`` (key -> value) and ``tensors`` (name -> TensorInfo)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open_regular(self.path) as handle:
                self._fd = os.dup(handle.fileno())
        except UnsafePath as error:
            raise GgufError(str(error)) from None
        try:
            self.size = os.fstat(self._fd).st_size
            self._read(_Cursor(self._fd, self.size, self.path))
        except BaseException:
            os.close(self._fd)
            raise

    def _read(self, cursor: _Cursor) -> None:
        if self.size < 4 or bytes(os.pread(self._fd, 4, 0)) != MAGIC:
            raise GgufError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        cursor.pos = 4
        version = cursor.take("I")
        if version not in (2, 3):
            raise GgufError(f"{self.path}: GGUF version {version}; this reader takes versions 2 and 3")
        tensor_count, kv_count = cursor.take("Q"), cursor.take("Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            if key in self.metadata:
                raise GgufError(f"{self.path}: metadata key {shown(key)} appears twice")
            self.metadata[key] = cursor.value(cursor.take("I"))
        infos = [self._tensor_info(cursor) for _ in range(tensor_count)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise GgufError(f"{self.path}: general.alignment is {shown(alignment)}, not a power of two")
        start = -(-cursor.pos // alignment) * alignment
        # a tensor of a type whose size is unknown extends to the next tensor (or the file's end):
        # it can be skipped, never read
        for i, (name, shape, kind, offset, nbytes) in enumerate(infos):
            if nbytes < 0:
                end = infos[i + 1][3] if i + 1 < len(infos) else self.size - start
                if end <= offset:
                    raise GgufError(f"{self.path}: tensor {shown(name)} ({kind.name}) has no bytes before the next")
                infos[i] = (name, shape, kind, offset, end - offset)
        self.tensors: dict[str, TensorInfo] = {}
        expected = 0  # each tensor at the running offset, as llama.cpp requires: no overlap, no gap
        for name, shape, kind, offset, nbytes in infos:
            if name in self.tensors:
                raise GgufError(f"{self.path}: tensor {shown(name)} appears twice")
            if offset != expected:
                raise GgufError(f"{self.path}: tensor {shown(name)} is at data offset {offset}, expected {expected}")
            if start + offset + nbytes > self.size:
                raise GgufError(f"{self.path}: tensor {shown(name)} runs past the end of the file (truncated?)")
            self.tensors[name] = TensorInfo(name, shape, kind, start + offset, nbytes, self.path)
            expected += -(-nbytes // alignment) * alignment

    def _tensor_info(self, cursor: _Cursor) -> tuple[str, tuple[int, ...], GgmlType, int, int]:
        name = cursor.string()
        n_dims = cursor.take("I")
        if n_dims > MAX_DIMS:
            raise GgufError(f"{self.path}: tensor {shown(name)} has {n_dims} dimensions; GGUF allows {MAX_DIMS}")
        dims = [cursor.take("Q") for _ in range(n_dims)]
        type_id, offset = cursor.take("I"), cursor.take("Q")
        kind, shape = ggml_type(type_id), tuple(reversed(dims))
        if kind.sized and shape and shape[-1] % kind.block_values:
            raise GgufError(f"{self.path}: tensor {shown(name)}'s rows ({shape[-1]}) are not whole {kind.name} blocks")
        count = math.prod(shape)  # Python integers: a product past int64 is caught, not wrapped
        if count >= 2**62:
            raise GgufError(f"{self.path}: tensor {shown(name)}'s dimensions {list(dims)} hold more than 2^62 values")
        return name, shape, kind, offset, count // kind.block_values * kind.block_bytes if kind.sized else -1

    def data(self, info: TensorInfo) -> np.ndarray[Any, Any]:
        """The tensor's bytes, uint8 ``[..., rows, blocks a row * block bytes]``: a copy read now
        (a file that shrank meanwhile is a GgufError naming it and the tensor)."""
        if not info.type.sized:
            raise GgufError(
                f"{self.path}: tensor {info.name} is {info.type.name}, which cannot be read: {info.type.why}"
            )
        flat = np.empty(info.nbytes, dtype=np.uint8)
        view, done = flat.data, 0
        while done < info.nbytes:
            got = os.preadv(self._fd, [view[done:]], info.offset + done)
            if got <= 0:
                at = info.offset + done
                raise GgufError(
                    f"{self.path}: tensor {info.name} is cut short at byte {at} (the file changed under us)"
                )
            done += got
        row = info.shape[-1] // info.type.block_values * info.type.block_bytes if info.shape else info.nbytes
        return flat.reshape(*info.shape[:-1], row)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def model_files(path: str | Path) -> list[Path]:
    """The files of the model at ``path``: the file itself, all the parts of a split model (from
    any part), or the one model a directory holds (one .gguf, or the parts of one split)."""
    target = Path(path)
    if target.is_dir():
        found = sorted(target.glob("*.gguf"))
        checkpoint = sorted(p.name for p in (target / "config.json", *target.glob("*.safetensors")) if p.exists())
        if found and checkpoint:
            raise GgufError(
                f"{target} holds a checkpoint ({shown(', '.join(checkpoint[:3]))}) and GGUF files "
                f"({shown(', '.join(p.name for p in found[:3]))}); pass the .gguf file, or move one of them"
            )
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
    if not 1 <= int(match["index"]) <= count:
        raise GgufError(f"{target}: part {int(match['index'])} of {count} is not a part a split model can have")
    parts = [target.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        named = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise GgufError(
            f"{target} is part {int(match['index'])} of a split model of {count} parts; "
            f"{len(missing)} of them are missing ({named})"
        )
    try:  # the other parts are the directory's own (or its hub snapshot's blobs): no link leads elsewhere
        return [p if p == target else member(target.parent, p.name, f"{target.parent}: split part") for p in parts]
    except UnsafePath as error:
        raise GgufError(str(error)) from None


class GgufModel:
    """A model's GGUF files as one: the first file's metadata, every file's tensors."""

    def __init__(self, path: str | Path) -> None:
        self.files: list[GgufFile] = []
        try:
            for p in model_files(path):
                self.files.append(GgufFile(p))
            self._join()
        except BaseException:
            self.close()
            raise
        self.path = self.files[0].path
        self.metadata = self.files[0].metadata
        self._by_path = {part.path: part for part in self.files}

    def _join(self) -> None:
        """Every part's tensors as one directory, each part's split.* keys held to its name (as
        llama.cpp's llama_split_prefix and split.no / split.count), the tensor count to the
        parts' sum, and no tensor in two parts."""
        self.tensors: dict[str, TensorInfo] = {}
        total = sum(len(part.tensors) for part in self.files)
        for number, part in enumerate(self.files):
            stated = (part.metadata.get("split.no"), part.metadata.get("split.count"))
            if len(self.files) > 1 and stated != (number, len(self.files)):
                raise GgufError(
                    f"{part.path}: split.no, split.count are {shown(stated)}; as part {number + 1} of "
                    f"{len(self.files)} they must be {(number, len(self.files))} (a part of another split?)"
                )
        for part in self.files:
            if len(self.files) > 1 and part.metadata.get("split.tensors.count") != total:
                raise GgufError(
                    f"{part.path}: split.tensors.count is {shown(part.metadata.get('split.tensors.count'))}, "
                    f"but the {len(self.files)} parts hold {total} tensors (a part of another split?)"
                )
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise GgufError(f"{part.path}: tensor {shown(name)} is also in {self.tensors[name].file.name}")
                self.tensors[name] = info

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
