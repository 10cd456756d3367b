"""The safetensors reader on hostile files: offsets that overlap, repeat or leave gaps, values
of the wrong type, a file truncated or rewritten after it was opened, and mutated bytes.
Every case ends in a SafetensorsError naming the file, or in exactly what the `safetensors`
package reads from the same bytes; never SIGBUS, never aliased bytes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as package_load
from safetensors.numpy import save

from ktforge.checkpoints.safetensors_io import SafetensorsError, SafetensorsFile

TENSORS = {
    "a": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b": np.arange(6, dtype=np.int8).reshape(2, 3),
    "c": np.ones((2, 2), dtype=np.int64),
}


def _valid() -> bytes:
    return save(TENSORS)


def _with_header(header: dict[str, Any], data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _parts(blob: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def _ours(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    with SafetensorsFile(path) as f:
        return {name: np.array(f.get(name)) for name in f.tensors}


def _edited(tmp_path: Path, edit: Any) -> Path:
    header, data = _parts(_valid())
    data = edit(header, data) or data
    path = tmp_path / "model.safetensors"
    path.write_bytes(_with_header(header, data))
    return path


def _offsets(name: str, begin: object, end: object) -> Any:
    def edit(header: dict[str, Any], data: bytes) -> None:
        header[name]["data_offsets"] = [begin, end]

    return edit


def _span(header: dict[str, Any], name: str) -> tuple[int, int]:
    begin, end = header[name]["data_offsets"]
    return int(begin), int(end)


HOSTILE: dict[str, tuple[Any, str]] = {
    # two tensors on the same bytes: the package says "invalid offset"; so do we
    "repeated": (lambda h, d: h["b"].update(data_offsets=h["c"]["data_offsets"], shape=[4, 8], dtype="I8"), "overlaps"),
    "overlapping": (
        lambda h, d: h["b"].update(data_offsets=[_span(h, "a")[0] + 4, _span(h, "a")[0] + 10]),
        "overlaps|gap",
    ),
    "shifted": (lambda h, d: h["b"].update(data_offsets=[x + 1 for x in _span(h, "b")]), "overlaps|gap"),
    "trailing bytes": (lambda h, d: d + b"\0" * 8, "bytes after the last tensor"),
    "beyond the file": (lambda h, d: d[:-4], "truncated"),
    "float offsets": (lambda h, d: h["a"].update(data_offsets=[0.0, 48.0]), "not byte offsets"),
    "bool offsets": (lambda h, d: h["a"].update(data_offsets=[False, 48]), "not byte offsets"),
    "negative offsets": (lambda h, d: h["a"].update(data_offsets=[-8, 40]), "not byte offsets"),
    "three offsets": (lambda h, d: h["a"].update(data_offsets=[0, 24, 48]), "malformed"),
    "negative shape": (lambda h, d: h["a"].update(shape=[-3, -4]), "not a list of sizes"),
    "float shape": (lambda h, d: h["a"].update(shape=[3.0, 4]), "not a list of sizes"),
    "shape and size disagree": (lambda h, d: h["a"].update(shape=[4, 4]), "hold"),
    "metadata not an object": (lambda h, d: h.update(__metadata__=[1, 2]), "__metadata__"),
    "unknown dtype": (lambda h, d: h["a"].update(dtype="Q4_K"), "does not read"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_naming_the_file(case: str, tmp_path: Path) -> None:
    edit, why = HOSTILE[case]
    path = _edited(tmp_path, edit)
    with pytest.raises(SafetensorsError, match=why) as error:
        _ours(path)
    assert str(path) in str(error.value)


def test_the_valid_file_reads_as_the_package_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(_valid())
    ours = _ours(path)
    assert ours.keys() == TENSORS.keys()
    for name, array in package_load(_valid()).items():
        np.testing.assert_array_equal(ours[name], array)


def test_a_file_truncated_after_it_was_opened_is_an_error_not_sigbus(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    path.write_bytes(save({"w": np.ones((1024, 1024), np.float32)}))
    with SafetensorsFile(path) as f:
        os.truncate(path, 4096)  # a re-download restarting, a full disk
        with pytest.raises(SafetensorsError, match="changed since it was opened") as error:
            f.get("w")
        assert str(path) in str(error.value)


def test_a_file_rewritten_after_it_was_opened_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "shard.safetensors"
    path.write_bytes(save({"w": np.ones((64, 64), np.float32)}))
    with SafetensorsFile(path) as f:
        path.write_bytes(save({"w": np.zeros((64, 64), np.float32)}))  # same size, new bytes
        os.utime(path, ns=(1, 1))
        with pytest.raises(SafetensorsError, match="changed since it was opened"):
            f.get("w")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_files_end_in_a_clean_error_or_the_package_s_result(tmp_path: Path, data: st.DataObject) -> None:
    blob = bytearray(_valid())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        where = data.draw(st.integers(0, len(blob) - 1))
        if kind == "flip":
            blob[where] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del blob[where : where + data.draw(st.integers(1, 16))]
        else:
            blob[where:where] = data.draw(st.binary(min_size=1, max_size=8))
        if not blob:
            blob = bytearray(b"\0")
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(bytes(blob))
    try:
        ours = _ours(path)
    except SafetensorsError as error:
        assert str(path) in str(error)
        return
    theirs = package_load(bytes(blob))  # what we accept, the package accepts too, equal
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name])
