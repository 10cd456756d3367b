"""Reading and streaming-writing safetensors files, with errors that name file and tensor.

Reading does not go through the ``safetensors`` package: its NumPy front end cannot return
FP8 (``F8_E4M3``: DeepSeek-V3's weights) without torch, which the kernels must not depend on,
and it reports a truncated or corrupt file without saying which tensor is affected. The format
is small (8-byte little-endian header length, JSON header, raw little-endian data), so the
header is checked here in full and tensors are memory-mapped: reading a layer touches only
that layer's bytes. Written files are plain safetensors that the package reads (tested).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

Array = np.ndarray[Any, Any]

DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER_BYTES = 100 << 20  # the format's own limit


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of this safetensors dtype and shape."""
    return int(np.prod(shape, dtype=np.int64)) * int(np.dtype(DTYPES[dtype]).itemsize)


def as_bytes(array: Array) -> memoryview:
    """An array's bytes in C order (no copy when it is contiguous; works for bfloat16/FP8)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, or lacks what was asked of it."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data section
    end: int


class SafetensorsFile:
    """One safetensors file, header validated on open, tensors memory-mapped on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file: BinaryIO = self.path.open("rb")
        except OSError as error:
            raise SafetensorsError(f"{self.path}: cannot open ({error.strerror})") from error
        try:
            self.size = os.fstat(self._file.fileno()).st_size
            self.header_bytes, self.tensors, self.metadata = self._read_header()
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
        except Exception:
            self._file.close()
            raise

    def _read_header(self) -> tuple[bytes, dict[str, TensorInfo], dict[str, str]]:
        prefix = self._file.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{self.path}: truncated ({self.size} bytes; not a safetensors file)")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or 8 + length > self.size:
            raise SafetensorsError(
                f"{self.path}: header length {length} does not fit a {self.size}-byte file (truncated or corrupt)"
            )
        raw = self._file.read(length)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SafetensorsError(f"{self.path}: header is not valid JSON ({error})") from error
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        data_size = self.size - 8 - length
        tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            try:
                dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            except (KeyError, TypeError, ValueError) as error:
                raise SafetensorsError(f"{self.path}: tensor {name!r} has a malformed header entry") from error
            if dtype not in DTYPES:
                raise SafetensorsError(f"{self.path}: tensor {name!r} has dtype {dtype}, which ktforge does not read")
            if end - begin != nbytes(dtype, shape) or begin < 0:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r}: {dtype} {list(shape)} does not match its offsets"
                )
            if end > data_size:
                raise SafetensorsError(
                    f"{self.path}: tensor {name!r} ends at byte {end} of a {data_size}-byte data section "
                    "(the file is truncated)"
                )
            tensors[name] = TensorInfo(name, dtype, shape, begin, end)
        return raw, tensors, {str(k): str(v) for k, v in metadata.items()}

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        # arrays handed out keep the mapping alive; it closes when the last one is gone
        self._map = None
        self._file.close()

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor {name!r}") from None

    def raw(self, name: str) -> memoryview:
        """The tensor's bytes, without copying."""
        t = self.info(name)
        if self._map is None:
            return memoryview(b"")
        start = 8 + len(self.header_bytes) + t.begin
        return memoryview(self._map)[start : start + t.end - t.begin]

    def release(self, name: str) -> None:
        """Drops the tensor's pages from this process (they stay in the page cache): a
        checkpoint read once, tensor by tensor, then never holds more than what is in use."""
        t = self.info(name)
        if self._map is None or t.end == t.begin:
            return
        page = mmap.PAGESIZE
        start = (8 + len(self.header_bytes) + t.begin) // page * page
        end = min(-(-(8 + len(self.header_bytes) + t.end) // page) * page, self.size)
        self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def get(self, name: str) -> Array:
        """The tensor as a read-only array on the mapped file (no copy)."""
        t = self.info(name)
        return np.frombuffer(self.raw(name), dtype=DTYPES[t.dtype]).reshape(t.shape)


def _header(
    tensors: dict[str, tuple[str, tuple[int, ...]]], metadata: dict[str, str]
) -> tuple[bytes, dict[str, int], int]:
    """The header's bytes, each tensor's offset in the data section, and that section's size."""
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offsets, position = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = nbytes(dtype, shape)
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [position, position + size]}
        offsets[name] = position
        position += size
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data section 8-byte aligned, as the package writes it
    return raw, offsets, position


class StreamingWriter:
    """Writes a safetensors file whose tensors are known up front, filled slice by slice.

    The header is written first; ``write(name, index, array)`` puts ``array`` at row ``index``
    of the tensor's first axis, so a layer can be written one expert at a time. Writes go to
    ``path + ".partial"``; ``commit()`` flushes, fsyncs and renames it into place.
    """

    def __init__(self, path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], metadata: dict[str, str]) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.tensors = tensors
        header, self._offsets, data_size = _header(tensors, metadata)
        self._data_start = 8 + len(header)
        self.size = self._data_start + data_size
        self._file = self.partial.open("wb")
        self._file.write(struct.pack("<Q", len(header)) + header)
        self._file.flush()
        # sized up front: positional writes past the end of file are ~10x slower (measured)
        self._file.truncate(self.size)

    def write(self, name: str, index: int, array: Array) -> None:
        dtype, shape = self.tensors[name]
        if array.dtype != np.dtype(DTYPES[dtype]) or tuple(array.shape) != tuple(shape[1:]):
            raise SafetensorsError(
                f"{self.path}: {name}[{index}] is {array.dtype} {array.shape}, not {dtype} {shape[1:]}"
            )
        data = as_bytes(array)
        os.pwrite(self._file.fileno(), data, self._data_start + self._offsets[name] + index * data.nbytes)

    def commit(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.partial.replace(self.path)

    def abort(self) -> None:
        self._file.close()
        self.partial.unlink(missing_ok=True)
