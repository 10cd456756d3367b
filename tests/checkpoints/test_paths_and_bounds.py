"""Names and numbers read from files: every path a manifest or index names stays inside its
directory and is a regular file; no error quotes the bytes of a file of another format; one
writer per output directory; sizes, counts and nesting are bounded before they are used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import ktforge
from ktforge.checkpoints import convert
from ktforge.checkpoints.checkpoint import Checkpoint, CheckpointError
from ktforge.cli import commands as cli

from ..synthetic_checkpoints import write_checkpoint

runner = CliRunner()
KT = str(Path(sys.executable).parent / "kt")
SECRET = b"root:x:0:0:SECRET-CONTENT:/root:/bin/bash\n"


def kt_convert(src: Path, out: Path, *args: str) -> Any:
    return runner.invoke(cli.app, ["convert", "--input", str(src), "--output", str(out), *args])


@pytest.fixture
def converted(tmp_path: Path) -> Path:
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1, 2))
    assert kt_convert(src, out, "--quant", "int8").exit_code == 0
    return out


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "passwd"
    secret.write_bytes(SECRET)
    return secret


def _manifest_names(directory: Path, layer: int, name: str) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["layers"][str(layer)]["file"] = name
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _assert_no_secret(error: BaseException) -> None:
    text = str(error)
    assert "SECRET" not in text and "root:x" not in text and str(int.from_bytes(SECRET[:8], "little")) not in text


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink-out", "symlink-in-subdir-out"])
def test_a_manifest_cannot_name_a_file_outside_its_directory(converted: Path, tmp_path: Path, how: str) -> None:
    secret = _secret(tmp_path)
    if how == "dot-dot":
        name = "../passwd"
    elif how == "absolute":
        name = str(secret)
    else:
        link = converted / ("sub" if how == "symlink-in-subdir-out" else "") / "layer-009.safetensors"
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(secret)
        name = str(link.relative_to(converted))
    _manifest_names(converted, 1, name)
    with pytest.raises(ValueError, match="outside") as caught:
        ktforge.MoE.from_pretrained(converted, layer=1)
    _assert_no_secret(caught.value)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_special_file_is_refused_without_reading_it(converted: Path, kind: str) -> None:
    special = converted / "special.safetensors"
    if kind == "fifo":
        os.mkfifo(special)  # opening it for reading would wait for a writer forever
    elif kind == "directory":
        special.mkdir()
    else:
        special.symlink_to("/dev/zero")  # outside too; /dev/zero inside would read without end
    _manifest_names(converted, 1, special.name)
    result: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catch(result, converted), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "blocked on a special file"
    assert isinstance(result[0], ValueError) and ("regular file" in str(result[0]) or "outside" in str(result[0]))


def _catch(into: list[BaseException], directory: Path) -> None:
    try:
        ktforge.MoE.from_pretrained(directory, layer=1)
    except BaseException as error:  # handed to the test thread
        into.append(error)


def test_a_file_of_another_format_is_named_not_quoted(converted: Path, tmp_path: Path) -> None:
    # a layer file replaced by text inside the directory: refused without its bytes or length field
    (converted / "layer-001.safetensors").write_bytes(SECRET * 3)
    with pytest.raises(ValueError, match="not a safetensors file") as caught:
        ktforge.MoE.from_pretrained(converted, layer=1)
    _assert_no_secret(caught.value)


def test_a_symlinked_checkpoint_shard_pointing_outside_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", shards=2)
    shard = src / "model-00002-of-00002.safetensors"
    shard.unlink()
    shard.symlink_to(_secret(tmp_path))
    result = kt_convert(src, tmp_path / "out")
    assert result.exit_code == 2 and "outside" in result.output
    assert "SECRET" not in result.output and "root:x" not in result.output


def test_a_hub_snapshot_with_links_into_its_blobs_converts(tmp_path: Path) -> None:
    # huggingface_hub's cache: snapshots/<revision>/<file> are links to ../../blobs/<hash>
    plain = tmp_path / "plain"
    truth = write_checkpoint(plain, "qwen3_moe", shards=2)
    repo = tmp_path / "models--org--name"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(plain.iterdir())):
        (blobs / f"blob{i}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
    with Checkpoint(snapshot) as checkpoint:
        assert checkpoint.moe_layers == sorted(truth)
    assert kt_convert(snapshot, tmp_path / "out", "--quant", "bf16").exit_code == 0


@pytest.mark.parametrize("written", ["{}/", "./{}", ".//{}", "", "."])
def test_an_index_naming_a_shard_in_another_spelling_is_refused(written: str, tmp_path: Path) -> None:
    """One file, one name: "model.safetensors/" or "./model.safetensors" in a weight_map is refused."""
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        if shard.endswith("00002-of-00002.safetensors"):
            index["weight_map"][name] = written.format(shard)
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="is not a canonical file name"):
        Checkpoint(src)


def test_an_index_naming_a_shard_outside_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for name, shard in index["weight_map"].items():
        if shard.endswith("00002-of-00002.safetensors"):
            index["weight_map"][name] = "sub/../../passwd"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside"):
        Checkpoint(src)


# ---- one writer per output directory --------------------------------------------------------------


def test_a_second_conversion_into_the_same_output_says_so_and_touches_nothing(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "out"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1, 2))
    with convert.plan(src, out, "int8", 128, "auto", None) as first:
        before = sorted(p.name for p in out.iterdir())
        second = kt_convert(src, out, "--quant", "int8")
        assert second.exit_code == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and f"another kt convert (process {os.getpid()}) is writing into {out}" in lines[0]
        assert sorted(p.name for p in out.iterdir()) == before
        convert.run(first, 2, lambda *_: None)
    # the loser's rerun now finds the conversion finished and loadable
    again = kt_convert(src, out, "--quant", "int8")
    assert again.exit_code == 0 and "nothing to do" in again.output
    ktforge.MoE.from_pretrained(out, layer=2)


def test_two_conversions_at_once_leave_one_loadable_result(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "out"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1, 2, 3), E=8)
    command = [KT, "convert", "--input", str(src), "--output", str(out), "--quant", "int8", "--threads", "1"]
    runs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=120)[1] for run in runs]
    results = [(run.returncode, stderr) for run, stderr in zip(runs, outputs, strict=True)]
    assert sorted(code for code, _ in results)[0] == 0 and {code for code, _ in results} <= {0, 1}, results
    for code, stderr in results:
        assert code == 0 or (len(stderr.strip().splitlines()) == 1 and "another kt convert" in stderr), stderr
    final = kt_convert(src, out, "--quant", "int8")
    assert final.exit_code == 0
    for layer in (1, 2, 3):
        ktforge.MoE.from_pretrained(out, layer=layer)  # checksums verified
    assert not list(out.glob("*.partial")) and not list(out.glob(".*.partial"))


def test_temporary_files_never_follow_a_planted_link(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "out"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1,))
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in ("layer-001.safetensors.partial", "manifest.json.partial", ".ktforge-convert.json.partial"):
        (out / name).symlink_to(victim)
    assert kt_convert(src, out, "--quant", "int8").exit_code == 0
    assert victim.read_text() == "keep me"


# ---- sizes, counts, ranges and nesting read from input ---------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["config", "index", "header", "manifest", "state"])
def test_deeply_nested_json_is_one_line(tmp_path: Path, where: str) -> None:
    src, out = tmp_path / "hf", tmp_path / "out"
    write_checkpoint(src, "qwen3_moe", shards=2)
    deep = _nested(200_000)
    if where == "config":
        (src / "config.json").write_text(deep)
    elif where == "index":
        (src / "model.safetensors.index.json").write_text(deep)
    elif where == "header":
        shard = src / "model-00001-of-00002.safetensors"
        shard.write_bytes(len(deep).to_bytes(8, "little") + deep.encode())
    else:
        out.mkdir()
        (out / ("manifest.json" if where == "manifest" else ".ktforge-convert.json")).write_text(deep)
    result = kt_convert(src, out)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1
    assert "nested too deeply" in result.output


@pytest.mark.parametrize(
    "damage",
    [
        {"layers": []},
        {"layers": {"1": "layer-001.safetensors"}},
        {"layers": {"1": {"file": 3, "bytes": 1}}},
        {"layers": {"x": {}}},
        {"layers": {"1": {"file": "layer-001.safetensors", "bytes": 10, "tensors": {"gate.weight": {}}}}},
        {"num_experts": 2**40},
        {"method": ["int8"]},
    ],
    ids=["list", "string-entry", "number-file", "bad-key", "tensor-without-facts", "huge-size", "bad-method"],
)
@pytest.mark.parametrize("which", ["manifest.json", ".ktforge-convert.json"])
def test_a_damaged_manifest_or_state_is_one_line(
    converted: Path, tmp_path: Path, damage: dict[str, Any], which: str
) -> None:
    manifest = json.loads((converted / "manifest.json").read_text())
    (converted / which).write_text(json.dumps({**manifest, **damage}))
    result = kt_convert(tmp_path / "hf", converted, "--quant", "int8")
    assert result.exit_code == 2 and ": damaged (" in result.output and "Traceback" not in result.output
    if which == "manifest.json":
        with pytest.raises(ValueError, match=": damaged \\("):
            ktforge.MoE.from_pretrained(converted, layer=1)


def test_header_shapes_beyond_int64_do_not_wrap_into_a_valid_size(tmp_path: Path) -> None:
    from ktforge.checkpoints.safetensors_io import SafetensorsError, SafetensorsFile

    # 2**62 * 4 elements of 4 bytes wrap to 0 in int64 arithmetic: data_offsets [0, 0] would pass
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}).encode()
    path = tmp_path / "wrap.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(SafetensorsError, match="hold 0"):
        SafetensorsFile(path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**64, 0], "data_offsets": [0, 0]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(SafetensorsError, match="not a list of sizes"):
        SafetensorsFile(path)


def test_fp8_block_sizes_beyond_32_bits_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "deepseek_v3", dtype="fp8", config_overrides={})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [2**31, 128]
    (src / "config.json").write_text(json.dumps(config))
    result = kt_convert(src, tmp_path / "out")
    assert result.exit_code == 2 and "below 2^31" in result.output


def test_a_config_claiming_more_experts_than_the_files_hold_is_refused_at_once(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", E=4, config_overrides={"num_experts": 2**31 - 1})
    result = kt_convert(src, tmp_path / "out")
    assert result.exit_code == 2 and "holds 4 experts" in result.output
    with pytest.raises(CheckpointError, match="holds 4 experts"):
        ktforge.MoE.from_pretrained(src, layer=1, method="int8")


@pytest.mark.parametrize("spec", ["0-100000000000", "1-3000000", "-5-2", "99"])
def test_a_layer_range_beyond_the_model_is_one_short_line(tmp_path: Path, spec: str) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1, 2))
    result = kt_convert(src, tmp_path / "out", "--layers", spec)
    assert result.exit_code == 2 and len(result.output) < 300, result.output[:300]
    assert "MoE layers are 1-2" in result.output or "cannot read" in result.output
