"""`kt convert` and `kt bench` driven into each failure a careful user can cause: one line that
names the fix and a documented exit code (2: bad input or option, 1: the work failed), never a
traceback; nothing deleted that ktforge did not create; a finished conversion stays loadable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import ktforge
from ktforge import bench
from ktforge.cli import commands as cli

from ..synthetic_checkpoints import write_checkpoint

runner = CliRunner()


def _one_line(result: Any) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return str(lines[0])


def kt_convert(src: Path, out: Path, *args: str) -> Any:
    return runner.invoke(cli.app, ["convert", "--input", str(src), "--output", str(out), *args])


def _config_edit(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config[key] = value

    return edit


CONFIGS: dict[str, tuple[Callable[[Path], None], str]] = {
    "not an object": (lambda d: (d / "config.json").write_text("[1, 2]"), "not an object"),
    "not utf-8": (lambda d: (d / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}'), "not UTF-8"),
    "num_experts true": (lambda d: _rewrite(d, _config_edit("num_experts", True)), "num_experts must be"),
    "huge size": (lambda d: _rewrite(d, _config_edit("hidden_size", 2**31)), r"below 2\^31"),
    # input is quoted escaped and cut at 200 characters: no terminal control, no megabyte line
    "long model_type": (
        lambda d: _rewrite(d, _config_edit("model_type", "\x1b[2J" + "m" * 5000)),
        r"model_type '\\x1b\[2Jm{192}\.\.\. \(4809 more characters\) is not an MoE",
    ),
    "top_k above experts": (lambda d: _rewrite(d, _config_edit("num_experts_per_tok", 9)), "more experts"),
    "fewer experts than the files": (lambda d: _rewrite(d, _config_edit("num_experts", 2)), "holds expert 3"),
    "quantization_config a string": (
        lambda d: _rewrite(d, _config_edit("quantization_config", "fp8")),
        "quantization_config must be an object",
    ),
    "block size of one number": (
        lambda d: _rewrite(d, _config_edit("quantization_config", {"weight_block_size": [128]})),
        "two positive integers",
    ),
    "block size zero": (
        lambda d: _rewrite(d, _config_edit("quantization_config", {"weight_block_size": [0, 128]})),
        "two positive integers",
    ),
    "weight_map a list": (
        lambda d: (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a"]})),
        "weight_map must map",
    ),
    "weight_map outside": (lambda d: _index_edit(d, "../../etc/passwd"), "outside the checkpoint"),
    "float data_offsets": (lambda d: _shard_offsets(d, 0.5), "not byte offsets"),
}


def _rewrite(directory: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def _index_edit(directory: Path, shard: str) -> None:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = shard
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def _shard_offsets(directory: Path, value: object) -> None:
    shard = sorted(directory.glob("*.safetensors"))[0]
    blob = shard.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + length])
    name = next(n for n in header if n != "__metadata__")
    header[name]["data_offsets"][0] = value
    raw = json.dumps(header).encode()
    shard.write_bytes(len(raw).to_bytes(8, "little") + raw + blob[8 + length :])


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_convert_refuses_a_bad_checkpoint_in_one_line(case: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_checkpoint(src)
    change, why = CONFIGS[case]
    change(src)
    result = kt_convert(src, tmp_path / "out")
    line = _one_line(result)
    assert result.exit_code == 2 and re.search(why, line), line
    assert not (tmp_path / "out").exists()  # nothing written before everything was checked
    if case not in ("not an object", "not utf-8", "weight_map a list", "weight_map outside", "float data_offsets"):
        with pytest.raises(ValueError, match=why):  # from_pretrained refuses it the same way
            ktforge.MoE.from_pretrained(src, layer=1, method="int8")


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_convert_refuses_an_output_that_is_no_directory(where: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_checkpoint(src)
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    out = blocker if where == "a file" else blocker / "out"
    result = kt_convert(src, out)
    assert result.exit_code == 2 and "is a file, not a directory" in _one_line(result)
    assert blocker.read_text() == "mine"


def test_convert_never_deletes_partial_files_it_did_not_create(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    write_checkpoint(src)
    out.mkdir()
    theirs = out / "download.partial"
    theirs.write_text("someone else's")
    ours = out / "layer-001.safetensors.partial"  # an interrupted run of ours
    ours.write_text("stale")
    assert kt_convert(src, out, "--quant", "int8").exit_code == 0
    assert theirs.read_text() == "someone else's" and not ours.exists()


def test_a_failing_wider_rerun_leaves_the_finished_conversion_loadable(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    write_checkpoint(src, moe_layers=(1, 2))
    assert kt_convert(src, out, "--quant", "int8", "--layers", "1").exit_code == 0
    before = ktforge.MoE.from_pretrained(out, layer=1)
    manifest = (out / "manifest.json").read_text()
    # the rerun over both layers fails while converting layer 2: one of its weights is NaN
    from safetensors.numpy import load_file, save_file

    name = "model.layers.2.mlp.experts.3.up_proj.weight"
    for shard in src.glob("*.safetensors"):
        tensors = load_file(str(shard))
        if name in tensors:
            bad = tensors[name].copy()
            bad[0, 0] = np.nan
            tensors[name] = bad
            save_file(tensors, str(shard))
    result = kt_convert(src, out, "--quant", "int8", "--layers", "1-2")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "NaN" in result.stderr.strip().splitlines()[-1]
    assert (out / "manifest.json").read_text() == manifest
    again = ktforge.MoE.from_pretrained(out, layer=1)
    assert again.info["packed_bytes"] == before.info["packed_bytes"]


@pytest.mark.parametrize("mask", [0o077, 0o022, 0o002])
def test_convert_writes_its_files_as_the_umask_says(mask: int, tmp_path: Path) -> None:
    """Converted weights are the user's to share: under umask 077 no other user may read them."""
    src = tmp_path / "src"
    write_checkpoint(src)
    out = tmp_path / "out"
    code = f"import os, sys; os.umask({mask}); from ktforge.cli import commands as cli; sys.argv[0] = 'kt'; cli.main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "convert", "--input", str(src), "--output", str(out), "--quant", "int8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files) and any(p.suffix == ".json" for p in files)
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_convert_on_a_full_disk_is_one_line_and_keeps_nothing_half_written(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_checkpoint(src, E=8, H=256, I=128)
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:  # no privilege to mount: the same failure through RLIMIT_FSIZE
        code = (
            "import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))\n"
            "import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "from ktforge.cli import commands as cli; sys.argv = ['kt', *sys.argv[1:]]; cli.main()\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, "convert", "--input", str(src), "--output", str(small / "out")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        stderr, code_ = done.stderr, done.returncode
    else:
        try:
            result = kt_convert(src, small / "out", "--quant", "bf16")
            stderr, code_ = result.stderr, result.exit_code
        finally:
            subprocess.run(["umount", str(small)], check=True)
    assert code_ == 1 and "Traceback" not in stderr, stderr
    assert "cannot write" in stderr and ("No space left" in stderr or "too large" in stderr), stderr
    if mounted.returncode != 0:
        assert not list((small / "out").glob("*.partial"))


BENCH_OPTIONS = {
    "routing": (["--routing", "nonsense"], "--routing: nonsense"),
    "method": (["--method", "int3"], "--method: int3"),
    "tokens": (["--tokens", "1,lots"], "--tokens"),
    "zero tokens": (["--tokens", "0"], "--tokens"),
    "repeats": (["--repeats", "0"], "--repeats: at least 1"),
    "threads": (["--threads", "-1"], "--threads: at least 1"),
    "tiny budget": (["--max-weight-gib", "0.001"], "--max-weight-gib 0.001 holds fewer"),
    "zero budget": (["--max-weight-gib", "0"], "--max-weight-gib: a positive size"),
    "infinite budget": (["--max-weight-gib", "inf"], "--max-weight-gib: a positive size"),
    "nan budget": (["--max-weight-gib", "nan"], "--max-weight-gib: a positive size"),
    "budget beyond the memory": (["--max-weight-gib", "1e9"], "GiB available; give less"),
    "threads beyond the kernels' limit": (["--threads", "5000"], "at most 4096"),
    "tokens beyond the memory": (["--model", "all", "--tokens", "1048576"], "give fewer tokens"),
    "empty backend": (["--backend", ""], "--backend: none given"),
    "empty model": (["--model", ""], "--model: none given in ''"),
    "only commas model": (["--model", ","], "--model: none given in ','"),
    "empty method": (["--method", " , "], "--method: none given"),
    "empty routing": (["--routing", ""], "--routing: none given"),
    "empty tokens": (["--tokens", ","], "--tokens: none given"),
    "empty threads": (["--threads", ""], "--threads: none given"),
    "binary model": (["--model", "\x01\x1b[2J" + "q" * 500], r"unknown model(s) '\x01\x1b[2Jqq"),
}


@pytest.mark.parametrize("case", sorted(BENCH_OPTIONS))
def test_bench_refuses_each_bad_option_in_one_line(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args, why = BENCH_OPTIONS[case]
    measured: list[str] = []
    monkeypatch.setattr(bench.bounds, "measure_peaks", lambda *a: measured.append("peaks") or {})
    result = runner.invoke(cli.app, ["bench", "--no-peer", *args])
    assert result.exit_code == 2 and why in _one_line(result)
    assert measured == []  # refused before measuring anything


@pytest.mark.parametrize("source", ["binary file", "binary pyproject", "empty pyproject", "fifo pyproject"])
def test_build_refuses_a_source_that_is_no_checkout_in_one_line(source: str, tmp_path: Path) -> None:
    path = tmp_path / "src"
    if source == "binary file":
        path.write_bytes(bytes(range(256)) * 4)
    else:
        path.mkdir()
        pyproject = path / "pyproject.toml"
        if source == "fifo pyproject":
            os.mkfifo(pyproject)  # never opened for a read that would wait on a writer
        else:
            pyproject.write_bytes(b"" if source == "empty pyproject" else b'\xff\xfe name = "ktforge" \xde\xad')
    result = runner.invoke(cli.app, ["build", "--plan", "--source", str(path)])
    line = _one_line(result)
    assert result.exit_code == 2 and line.endswith("is not a ktforge checkout; run it there or pass --source"), line


def test_bench_with_a_backend_variable_naming_nothing_compiled() -> None:
    env = dict(os.environ, KTFORGE_BACKEND="avx1024")
    done = subprocess.run(
        [sys.executable, "-m", "ktforge", "bench", "--no-peer", "--tokens", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("kt bench: KTFORGE_BACKEND=avx1024 is not compiled"), done.stderr


def test_a_layer_beyond_the_memory_is_refused_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1024 experts of 32768 x 32768 in int4 at group 128: 1.5 TiB, more than any machine here (an OOM kill before)
    with pytest.raises(MemoryError, match=r"packed weights take 1584\.0 GiB \(1024 experts of 32768 x 32768, int4"):
        ktforge.MoE(1024, 8, 32768, 32768, method="int4")
    from ktforge.kernels import memory

    monkeypatch.setattr(memory, "memory_available", lambda: 1 << 30)  # a process that may take 1 GiB
    ktforge.MoE(8, 2, 4096, 4096, method="int8")  # 0.375 GiB
    with pytest.raises(MemoryError, match=r"take 1\.5 GiB .* int8 / int8\); this process can take 1\.0 GiB"):
        ktforge.MoE(32, 2, 4096, 4096, method="int8")


def test_sizes_beyond_32_bits_and_bad_aocl_threshold_are_named() -> None:
    with pytest.raises(ValueError, match="hidden_size must be below 2\\^31"):
        ktforge.MoE(4, 2, 2**31, 64)
    with pytest.raises(ValueError, match="threads must be at most 4096"):
        ktforge.MoE(4, 2, 64, 64, threads=100_000)


def test_convert_into_a_read_only_directory_is_one_line(tmp_path: Path) -> None:
    src, ro = tmp_path / "src", tmp_path / "ro"
    write_checkpoint(src)
    ro.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode
        == 0
    )
    if not mounted:  # without root, permissions make it read-only
        ro.chmod(0o500)
    try:
        result = kt_convert(src, ro / "out")
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=True)
        ro.chmod(0o700)
    assert result.exit_code == 2 and "is not writable" in _one_line(result)


def _package_copy(tmp_path: Path, change: Callable[[Path], None]) -> dict[str, str]:
    import shutil

    site = tmp_path / "site"
    shutil.copytree(Path(ktforge.__file__).parent, site / "ktforge", ignore=shutil.ignore_patterns("__pycache__"))
    change(site / "ktforge")
    return {**{k: v for k, v in os.environ.items() if not k.startswith("KTFORGE_")}, "PYTHONPATH": str(site)}


def _kt(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ktforge", *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd
    )


def test_convert_without_the_extension_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_checkpoint(src)
    env = _package_copy(tmp_path, lambda pkg: [p.unlink() for p in pkg.glob("_native*.so")])
    done = _kt(env, tmp_path, "convert", "--input", str(src), "--output", str(tmp_path / "out"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "native extension cannot be loaded" in done.stderr.strip().splitlines()[-1]


def test_bench_with_a_corrupt_build_record_is_one_line(tmp_path: Path) -> None:
    env = _package_copy(tmp_path, lambda pkg: (pkg / "build_record.json").write_text(""))
    done = _kt(env, tmp_path, "bench", "--no-peer", "--tokens", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("kt bench: the build record") and "is empty" in done.stderr


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_convert_finishes_with_an_unwritable_stderr(tmp_path: Path, stderr: str) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    write_checkpoint(src)
    kt = str(Path(sys.executable).parent / "kt")
    command = [kt, "convert", "--input", str(src), "--output", str(out), "--quant", "int8"]
    if stderr == "closed":  # `kt convert ... 2>&-`
        done = subprocess.run(command, preexec_fn=lambda: os.close(2), timeout=300)
    else:
        with Path("/dev/full").open("w") as full:
            done = subprocess.run(command, stderr=full, timeout=300)
    assert done.returncode == 0
    ktforge.MoE.from_pretrained(out, layer=2)
