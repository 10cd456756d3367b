"""Reading and streaming-writing safetensors files, with errors that name file and tensor.

Reading does not go through the ``safetensors`` package: its NumPy front end cannot return
FP8 (``F8_E4M3``: DeepSeek-V3's weights) without torch, which the kernels must not depend on,
and it reports a truncated or corrupt file without saying which tensor is affected. The format
is small (8-byte little-endian header length, JSON header, raw little-endian data), so the
header is checked here in full, as the format requires (dtype x shape = the tensor's bytes;
tensors back to back from offset 0 to the end of the data section, none overlapping, none
repeated; all within the file), and each tensor is read with pread when asked for: reading a
layer touches only that layer's bytes. Not mmap: a file truncated after it was opened (a
re-download, a full disk) would kill the process with SIGBUS on the next access; a short read
is an error that names the file and tensor. Written files are plain safetensors that the
package reads (tested).
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from ktforge.files import UnsafePath, open_regular, parse_json, shown
from ktforge.resources import shared_file_mode

Array = np.ndarray[Any, Any]

DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E8M0": np.uint8,  # E8M0 scale codes as their bytes (2^(e - 127))
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER_BYTES = 100 << 20  # the format's own limit


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of this safetensors dtype and shape (Python integers: a header's
    shape beyond int64 must not wrap around to a size that passes the checks)."""
    return math.prod(shape) * int(np.dtype(DTYPES[dtype]).itemsize)


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


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafetensorsFile:
    """One safetensors file, header validated on open, tensors read on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file: BinaryIO = open_regular(self.path)
        except UnsafePath as error:
            raise SafetensorsError(str(error)) from error
        except OSError as error:
            raise SafetensorsError(f"{self.path}: cannot open ({error.strerror})") from error
        try:
            opened = os.fstat(self._file.fileno())
            self.size = opened.st_size
            self._identity = (opened.st_size, opened.st_mtime_ns)
            self.header_bytes, self.tensors, self.metadata = self._read_header()
        except Exception:
            self._file.close()
            raise

    def _read_header(self) -> tuple[bytes, dict[str, TensorInfo], dict[str, str]]:
        prefix = self._file.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{self.path}: truncated ({self.size} bytes; not a safetensors file)")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or 8 + length > self.size:
            # not the length's value: these 8 bytes may be the start of any file (/etc/passwd)
            raise SafetensorsError(
                f"{self.path}: not a safetensors file (its header length does not fit the file: truncated or corrupt)"
            )
        raw = self._file.read(length)
        try:
            header = parse_json(raw, f"{self.path}: header")
        except ValueError as error:
            raise SafetensorsError(f"{error} (not a safetensors file, or a corrupt one)") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise SafetensorsError(f"{self.path}: __metadata__ is not a JSON object")
        data_size = self.size - 8 - length
        tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            try:
                dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
                begin, end = offsets
            except (KeyError, TypeError, ValueError) as error:
                raise SafetensorsError(f"{self.path}: tensor {shown(name)} has a malformed header entry") from error
            if dtype not in DTYPES:
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(name)} has dtype {dtype}, which ktforge does not read"
                )
            if not isinstance(shape, list) or not all(_is_count(n) and n < 2**63 for n in shape):
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(name)} has shape {shown(shape)}, not a list of sizes"
                )
            if not (_is_count(begin) and _is_count(end)):
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(name)}: data_offsets {shown(offsets)} are not byte offsets"
                )
            if end - begin != nbytes(dtype, tuple(shape)):
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(name)}: {dtype} {list(shape)} is {nbytes(dtype, tuple(shape))} bytes, "
                    f"its data_offsets [{begin}, {end}] hold {end - begin}"
                )
            tensors[name] = TensorInfo(name, dtype, tuple(shape), begin, end)
        # Back to back, in some order, from 0 to the end of the data section: offsets that overlap,
        # repeat or leave gaps would hand out aliased or stray bytes.
        position = 0
        for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
            if t.begin != position:
                what = "overlaps the tensor before it" if t.begin < position else f"leaves a gap at byte {position}"
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(t.name)} at data_offsets [{t.begin}, {t.end}] {what}"
                )
            if t.end > data_size:
                raise SafetensorsError(
                    f"{self.path}: tensor {shown(t.name)} ends at byte {t.end} of a {data_size}-byte data section "
                    "(the file is truncated)"
                )
            position = t.end
        if position < data_size:
            raise SafetensorsError(
                f"{self.path}: {data_size - position} bytes after the last tensor (corrupt, or not safetensors)"
            )
        return raw, tensors, {str(k): str(v) for k, v in metadata.items()}

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor {shown(name)}") from None

    def raw(self, name: str, offset: int = 0, size: int | None = None) -> memoryview:
        """The tensor's bytes (``size`` of them from ``offset``; all by default), read now; the
        file must still be the one whose header was read."""
        t = self.info(name)
        size = t.end - t.begin - offset if size is None else size
        buffer = bytearray(size)
        changed = f"{self.path}: changed since it was opened (truncated, rewritten or still being written)"
        try:
            now = os.fstat(self._file.fileno())
            if (now.st_size, now.st_mtime_ns) != self._identity:
                raise SafetensorsError(f"{changed}; reading tensor {shown(name)}")
            view, start, done = memoryview(buffer), 8 + len(self.header_bytes) + t.begin + offset, 0
            while done < size:
                got = os.preadv(self._file.fileno(), [view[done:]], start + done)
                if got == 0:
                    raise SafetensorsError(f"{changed}: tensor {shown(name)} ends after {done} of its {size} bytes")
                done += got
        except OSError as error:
            raise SafetensorsError(f"{self.path}: reading tensor {shown(name)} failed ({error.strerror})") from error
        return memoryview(buffer)

    def get(self, name: str) -> Array:
        """The tensor as a read-only array of its own (read now, see raw)."""
        t = self.info(name)
        array = np.frombuffer(self.raw(name), dtype=DTYPES[t.dtype]).reshape(t.shape)
        array.flags.writeable = False
        return array

    def get_item(self, name: str, index: int) -> Array:
        """``tensor[index]`` along its first axis (one expert of a fused tensor), reading only it."""
        t = self.info(name)
        if not t.shape or not 0 <= index < t.shape[0]:
            raise SafetensorsError(f"{self.path}: tensor {shown(name)} of shape {list(t.shape)} has no item {index}")
        item = (t.end - t.begin) // t.shape[0]
        array = np.frombuffer(self.raw(name, index * item, item), dtype=DTYPES[t.dtype]).reshape(t.shape[1:])
        array.flags.writeable = False
        return array


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
    a new file of unique name beside it (``.NAME.XXXXXXXX.partial``, created with O_EXCL: never
    another writer's file, never a planted link); ``commit()`` flushes, fsyncs and renames it into
    place.
    """

    def __init__(self, path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], metadata: dict[str, str]) -> None:
        self.path = path
        self.tensors = tensors
        header, self._offsets, data_size = _header(tensors, metadata)
        self._data_start = 8 + len(header)
        self.size = self._data_start + data_size
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        self.partial = Path(name)
        os.fchmod(fd, shared_file_mode())  # mkstemp's 0600, widened as far as the umask allows
        self._file = os.fdopen(fd, "wb")
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
