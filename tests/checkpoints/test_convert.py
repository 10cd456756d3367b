"""`kt convert` and `MoE.from_pretrained`: synthetic checkpoints in every naming scheme and
input dtype, round trips against the definition, interruption and resume, and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from typer.testing import CliRunner

import ktforge
from ktforge import formats
from ktforge.checkpoints import convert
from ktforge.checkpoints.checkpoint import Checkpoint, CheckpointError
from ktforge.cli import commands as cli
from ktforge.formats.quantize import Quantized, dequantize, quantize

from .. import host
from ..moe_reference import expected, float_reference, quantize_groups, quantize_int8_groups, quantize_rows
from ..synthetic_checkpoints import expert_tensor, shard_of, write_checkpoint

runner = CliRunner()
TOLERANCE = {
    "bf16": 2e-2,
    "int8": 5e-2,
    "int8g": 5e-2,
    "int4": 0.25,
}  # against the float64 layer (test_moe_correctness)


def inputs(H: int, E: int, k: int, T: int = 37, seed: int = 3) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int64)
    return x, ids, rng.random((T, k)).astype(np.float32)


def rel_err(a: Any, b: Any) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-12))


def kt_convert(src: Path, out: Path, *args: str) -> Any:
    return runner.invoke(cli.app, ["convert", "--input", str(src), "--output", str(out), *args])


# ---- the portable quantization is the kernels' own ----------------------------------------


def per_value(group_scales: Any, group: int, K: int) -> Any:
    """Each value's own int4 group scale, [..., K]."""
    return np.repeat(np.asarray(group_scales, np.float32), group, -1)[..., :K]


def assert_within_half_a_step(
    back: Any, w: Any, scale: Any, top: int, bottom: int | None = None, slack: float = 1e-7
) -> None:
    """Within half a step of the value's scale, but for values that would round past the top
    code (int4's 7: the opposite sign of their group's largest, about as large; int8g's 127
    where its scale is a bf16 step below max|w| / 127) or below the bottom one, which take it."""
    signed = np.broadcast_to(scale, w.shape)
    steps = w / signed
    low = -np.inf if bottom is None else bottom - 0.5
    clamped = (steps > top + 0.5) | (steps < low)
    assert (np.abs(back - w)[~clamped] <= np.abs(signed[~clamped]) / 2 + slack).all()
    edge = np.where(steps > 0, top, -np.inf if bottom is None else bottom)
    assert (np.abs(back[clamped] - (edge * signed)[clamped]) <= slack).all()


@pytest.mark.parametrize("method", ["int8", "int8g", "int4"])
def test_quantize_matches_the_independent_definition(method: str) -> None:
    w = np.random.default_rng(0).standard_normal((2, 19, 70)).astype(np.float32)
    w[0, 3] = 0  # an all-zero row gets scale 1
    q = quantize(w, method, 32)
    assert q.scale is not None
    for i in range(2):
        if method == "int8":
            ref_q, ref_scale = quantize_rows(w[i], 127)
            assert np.array_equal(q.weight[i], ref_q) and np.array_equal(q.scale[i], ref_scale)
        elif method == "int8g":
            ref_q, ref_scale = quantize_int8_groups(w[i], 32)
            assert np.array_equal(q.weight[i], ref_q[:, :70]) and np.array_equal(q.scale[i], ref_scale)
        else:
            ref_q, ref_scale = quantize_groups(w[i], 32)
            low, high = (q.weight[i] & 15).astype(int) - 8, (q.weight[i] >> 4).astype(int) - 8
            assert np.array_equal(np.stack([low, high], -1).reshape(19, -1), ref_q)
            assert np.array_equal(q.scale[i], ref_scale)
    back = dequantize(q, method, 70)
    assert back.shape == w.shape
    if method == "int8":
        assert_within_half_a_step(back, w, q.scale[..., None], 127)
    elif method == "int8g":  # a scale below max|w| / 127 clamps the largest to 127 steps
        assert_within_half_a_step(back, w, per_value(q.scale, 32, 70), 127, bottom=-127)
    else:
        assert_within_half_a_step(back, w, per_value(q.scale, 32, 70), 7)


def test_fp8_decoding_is_exact_for_every_code_and_uses_its_block_scale() -> None:
    import ml_dtypes

    import ktforge._native as _native

    codes = np.arange(256, dtype=np.uint8).reshape(8, 32)
    scale = np.array([[2.0, 0.5], [1.0, 3.0]], np.float32)  # 4x16 blocks
    finite = codes.copy()
    finite[(codes & 0x7F) == 0x7F] = 0
    got = _native.dequantize_fp8(finite, scale, 4, 16)
    want = finite.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(np.repeat(scale, 4, 0), 16, 1)
    assert np.array_equal(got, want)
    assert np.isnan(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).sum() == 2  # 0x7F and 0xFF
    with pytest.raises(ValueError, match=r"NaN in FP8 weights \(row 3\)"):  # 0x7F is in row 3
        _native.dequantize_fp8(codes, scale, 4, 16)
    with pytest.raises(ValueError, match="block scales do not match"):
        _native.dequantize_fp8(codes, scale[:1], 4, 16)


def test_quantize_refuses_non_finite_weights() -> None:
    w = np.ones((3, 64), np.float32)
    w[2, 5] = np.inf
    with pytest.raises(ValueError, match=r"NaN or infinite values \(row 2\)"):
        quantize(w, "int8")


@pytest.mark.parametrize("method", ["bf16", "int8", "int8g", "int4", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("backend", host.tested_backends())
def test_load_quantized_gives_exactly_the_results_of_load_weights(method: str, backend: str) -> None:
    E, k, H, I = 5, 2, 88, 72
    rng = np.random.default_rng(1)
    gate, up = (rng.standard_normal((E, I, H)).astype(np.float32) for _ in range(2))
    down = rng.standard_normal((E, H, I)).astype(np.float32)
    x, ids, w = inputs(H, E, k)
    group = formats.group_for(method, 32)  # nvfp4's 16
    a = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group)
    a.load_weights(gate, up, down)
    b = ktforge.MoE(E, k, H, I, method=method, backend=backend, group_size=group)
    b.load_quantized(*(quantize(p, method, group) for p in (gate, up, down)))
    assert np.array_equal(a.forward(x, ids, w), b.forward(x, ids, w))


def test_load_quantized_rejects_wrong_layouts() -> None:
    E, k, H, I = 3, 1, 64, 32
    w = np.random.default_rng(0).standard_normal((E, I, H)).astype(np.float32)
    d = np.random.default_rng(1).standard_normal((E, H, I)).astype(np.float32)
    moe = ktforge.MoE(E, k, H, I, method="int8")
    good = quantize(w, "int8"), quantize(w, "int8"), quantize(d, "int8")
    with pytest.raises(ValueError, match=r"down.weight is int8 \(3, 32, 64\).*needs int8 \(3, 64, 32\)"):
        moe.load_quantized(good[0], good[1], good[0])
    with pytest.raises(ValueError, match=r"gate\.scale is float64"):
        moe.load_quantized(Quantized(good[0].weight, good[0].scale.astype(np.float64)), good[1], good[2])  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"gate\.weight is uint8"):
        moe.load_quantized(quantize(w, "int4", 32), good[1], good[2])
    with pytest.raises(ValueError, match="not positive and finite"):
        moe.load_quantized(Quantized(good[0].weight, np.zeros((E, I), np.float32)), good[1], good[2])
    with pytest.raises(TypeError):
        moe.load_quantized(w, good[1], good[2])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="before load_weights"):
        moe.forward(np.zeros((1, H), np.float32), np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32))


# ---- round trips ------------------------------------------------------------------------------

CASES = [
    ("qwen3_moe", "bf16", "int8"),
    ("qwen3_moe", "bf16", "int4"),
    ("deepseek_v3", "fp8", "int8"),
    ("deepseek_v3", "fp8", "int4"),
    ("deepseek_v3", "fp8", "int8g"),
    ("deepseek_v3", "fp8", "bf16"),
    ("mixtral", "fp32", "int8"),
    ("mixtral", "fp16", "bf16"),
]


@pytest.mark.parametrize(("arch", "dtype", "method"), CASES)
def test_convert_load_forward_round_trip(tmp_path: Path, arch: str, dtype: str, method: str) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    truth = write_checkpoint(src, arch, dtype=dtype, E=4, k=2, H=80, I=48)
    result = kt_convert(src, out, "--quant", method, "--group-size", "32")
    assert result.exit_code == 0, result.output
    assert "GB/s of input" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["layers"]) == ["1", "2"]  # the dense layer 0 has no routed experts
    assert manifest["method"] == method and manifest["architecture"] == arch
    x, ids, w = inputs(80, 4, 2)
    for layer, (gate, up, down) in truth.items():
        converted = ktforge.MoE.from_pretrained(out, layer=layer)
        online = ktforge.MoE.from_pretrained(src, layer=layer, method=method, group_size=32)
        assert converted.info["method"] == method
        y = converted.forward(x, ids, w)
        assert np.array_equal(y, online.forward(x, ids, w))  # the same quantization, bit for bit
        assert rel_err(y, expected(x, ids, w, gate, up, down, method, 32)) < 2e-3
        assert rel_err(y, float_reference(x, ids, w, gate, up, down)) < TOLERANCE[method]


def test_output_is_standard_safetensors_with_the_manifest_checksums(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    truth = write_checkpoint(src, "deepseek_v3", dtype="fp8", E=3, H=64, I=40)
    assert kt_convert(src, out, "--quant", "int4", "--group-size", "32").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "ktforge-moe-experts" and manifest["format_version"] == 3
    assert set(manifest["source"]["shards"]) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    entry = manifest["layers"]["2"]
    with safe_open(str(out / entry["file"]), framework="numpy") as f:  # the package reads it
        assert set(f.keys()) == {f"{p}.{part}" for p in ("gate", "up", "down") for part in ("weight", "scale")}
        for name, spec in entry["tensors"].items():
            array = f.get_tensor(name)
            assert list(array.shape) == spec["shape"]
            assert hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() == spec["sha256"]
        gate = Quantized(f.get_tensor("gate.weight"), f.get_tensor("gate.scale"))
    # the documented layout: dequantizing gives the checkpoint's weights within half a step
    assert gate.scale is not None
    assert_within_half_a_step(dequantize(gate, "int4", 64), truth[2][0], per_value(gate.scale, 32, 64), 7, slack=1e-6)


def test_shared_experts_and_dense_layers_are_left_alone(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "deepseek_v3", dtype="bf16", moe_layers=(1, 3))
    with Checkpoint(src) as checkpoint:
        assert checkpoint.moe_layers == [1, 3]
        assert checkpoint.arch.label == "DeepSeek-V3"
    with pytest.raises(ValueError, match="layer 2 holds no routed experts; MoE layers are 1,3"):
        ktforge.MoE.from_pretrained(src, layer=2)


def test_layers_option_and_extending_a_conversion(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "qwen3_moe", moe_layers=(1, 2, 3, 5), shards=1)
    assert kt_convert(src, out, "--layers", "2-3").exit_code == 0
    assert sorted(json.loads((out / "manifest.json").read_text())["layers"]) == ["2", "3"]
    with pytest.raises(ValueError, match="layer 1 was not converted; converted layers: 2-3"):
        ktforge.MoE.from_pretrained(out, layer=1)
    before = (out / "layer-002.safetensors").stat().st_mtime_ns
    assert kt_convert(src, out, "--layers", "1,5").exit_code == 0
    assert sorted(json.loads((out / "manifest.json").read_text())["layers"]) == ["1", "2", "3", "5"]
    assert (out / "layer-002.safetensors").stat().st_mtime_ns == before
    bad = kt_convert(src, out, "--layers", "4")
    assert bad.exit_code == 2 and "layer(s) 4 hold no routed experts; MoE layers are 1-3,5" in bad.output
    assert convert.parse_layers("1,3-5", [1, 2, 3, 4, 5, 6]) == [1, 3, 4, 5]
    with pytest.raises(convert.ConversionError, match="cannot read"):
        convert.parse_layers("5-3", [3, 4, 5])


# ---- interruption and resume ------------------------------------------------------------------


def test_interrupted_conversion_resumes_without_redoing_finished_layers(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "mixtral", dtype="bf16", moe_layers=(0, 1, 2))
    plan = convert.plan(src, out, "int8", 128, "auto", None)

    def stop_in_second_layer(done: int, finished: int, label: str) -> None:
        if label == "layer 1" and done > plan.source_bytes(0):
            raise KeyboardInterrupt

    with plan, pytest.raises(KeyboardInterrupt):
        convert.run(plan, 2, stop_in_second_layer)
    # never looks complete: no manifest, no half-written layer, the finished one recorded
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.iterdir()) == [
        ".ktforge-convert.json",
        ".ktforge-convert.lock",  # kept: removing a lock file would let two writers in
        "layer-000.safetensors",
    ]
    with pytest.raises(ValueError, match=r"unfinished.*run the same `kt convert` command again"):
        ktforge.MoE.from_pretrained(out, layer=0)
    # a crash mid-write also leaves a .partial file behind; it is discarded
    (out / "layer-001.safetensors.partial").write_bytes(b"junk")
    first = (out / "layer-000.safetensors").stat()
    result = kt_convert(src, out, "--quant", "int8")
    assert result.exit_code == 0, result.output
    assert "1 already done, resuming" in result.output
    assert (out / "layer-000.safetensors").stat().st_mtime_ns == first.st_mtime_ns
    assert sorted(p.name for p in out.iterdir()) == [
        ".ktforge-convert.lock",
        "layer-000.safetensors",
        "layer-001.safetensors",
        "layer-002.safetensors",
        "manifest.json",
    ]
    again = kt_convert(src, out, "--quant", "int8")
    assert again.exit_code == 0 and "already holds these 3 layer(s); nothing to do" in again.output


def test_a_truncated_finished_layer_is_redone(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "qwen3_moe")
    assert kt_convert(src, out).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").rename(out / ".ktforge-convert.json")  # as if killed before the manifest
    with (out / "layer-002.safetensors").open("r+b") as f:
        f.truncate(100)
    assert kt_convert(src, out).exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["layers"] == manifest["layers"]


# ---- bad input ---------------------------------------------------------------------------------


def test_missing_expert_tensor_names_the_tensor_and_writes_nothing_for_its_layer(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    missing = expert_tensor("qwen3_moe", 2, 3, 1)
    write_checkpoint(src, "qwen3_moe", drop=(missing,))
    result = kt_convert(src, out)
    assert result.exit_code == 1
    assert f"tensor '{missing}' (layer 2, expert 3, up) is missing" in result.output
    assert not (out / "manifest.json").exists() and not list(out.glob("*.partial"))
    assert not (out / "layer-002.safetensors").exists()
    with pytest.raises(CheckpointError, match="is missing"):
        ktforge.MoE.from_pretrained(src, layer=2, method="int8")


def test_wrong_shape_and_dtype_and_input_type(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "mixtral", dtype="bf16", config_overrides={"intermediate_size": 25})
    name = expert_tensor("mixtral", 1, 0, 0)
    with pytest.raises(
        CheckpointError,
        match=rf"{shard_of(src, name)}: tensor '{name}' has shape \[24, 40\]; config.json implies \[25, 40\]",
    ):
        ktforge.MoE.from_pretrained(src, layer=1)
    src2 = tmp_path / "hf2"
    write_checkpoint(src2, "qwen3_moe", dtype="fp16")
    result = kt_convert(src2, tmp_path / "out", "--input-type", "bf16")
    assert result.exit_code == 1 and "is F16, but the input type was given as bf16" in result.output
    assert kt_convert(src2, tmp_path / "out2", "--input-type", "fp16").exit_code == 0
    assert kt_convert(src2, tmp_path / "out3", "--input-type", "int3").exit_code == 2


def _rewrite(shard: Path, name: str, change: Any) -> None:
    from safetensors.numpy import save_file

    from ktforge.checkpoints.safetensors_io import SafetensorsFile

    with SafetensorsFile(shard) as f:
        tensors = {n: np.array(f.get(n)) for n in f.tensors}
    tensors[name] = change(tensors[name])
    save_file(tensors, str(shard))


def test_integer_weights_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", shards=1)
    name = expert_tensor("qwen3_moe", 1, 0, 2)
    _rewrite(src / "model.safetensors", name, lambda t: t.astype(np.float32).astype(np.int32))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' is I32; expected bf16, fp16, fp32 or fp8"):
        ktforge.MoE.from_pretrained(src, layer=1)


@pytest.mark.parametrize(("dtype", "quant"), [("bf16", "int8"), ("bf16", "bf16"), ("fp8", "int4"), ("fp8", "bf16")])
def test_nan_weights_name_the_tensor(tmp_path: Path, dtype: str, quant: str) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "deepseek_v3", dtype=dtype, shards=1)
    name = expert_tensor("deepseek_v3", 2, 1, 0)

    def poison(t: Any) -> Any:
        t = t.copy()
        t[3, 4] = np.nan
        return t

    _rewrite(src / "model.safetensors", name, poison)
    result = kt_convert(src, tmp_path / "out", "--quant", quant)
    assert result.exit_code == 1
    assert f"model.safetensors: tensor '{name}': " in result.output
    assert "NaN" in result.output
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_truncated_and_corrupt_shards(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", shards=1)
    shard = src / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    result = kt_convert(src, tmp_path / "out")
    assert result.exit_code == 2
    assert f"{shard}: tensor" in result.output and "(the file is truncated)" in result.output
    shard.write_bytes(data[:5])
    assert "truncated" in kt_convert(src, tmp_path / "out").output
    shard.write_bytes(data[:8] + b"{not json" + data[17:])
    assert "header is not valid JSON" in kt_convert(src, tmp_path / "out").output
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_fp8_scales_must_match_their_blocks(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(
        src, "deepseek_v3", dtype="fp8", config_overrides={"quantization_config": {"weight_block_size": [8, 8]}}
    )
    with pytest.raises(
        CheckpointError, match=r"weight_scale_inv has shape \[2, 3\]; 8x8 blocks of \[24, 40\] need \[3, 5\]"
    ):
        ktforge.MoE.from_pretrained(src, layer=1, method="int8")
    src2 = tmp_path / "hf2"
    scale = expert_tensor("deepseek_v3", 2, 1, 0) + "_scale_inv"
    write_checkpoint(src2, "deepseek_v3", dtype="fp8", drop=(scale,))
    assert f"tensor '{scale}' (the block scales of" in kt_convert(src2, tmp_path / "o").output


def test_unknown_architecture_and_not_a_checkpoint(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", config_overrides={"model_type": "llama"})
    result = kt_convert(src, tmp_path / "out")
    assert result.exit_code == 2
    assert "model_type 'llama' is not an MoE architecture ktforge knows; supported: Qwen3-MoE" in result.output
    assert "config.json: not found" in kt_convert(tmp_path / "nowhere", tmp_path / "out").output
    assert "must not be the input" in kt_convert(src, src).output


def test_checksum_mismatch_and_a_different_conversion_in_the_way(tmp_path: Path) -> None:
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "qwen3_moe")
    assert kt_convert(src, out, "--quant", "int4", "--group-size", "32").exit_code == 0
    result = kt_convert(src, out, "--quant", "int8")
    assert result.exit_code == 2
    assert "holds a conversion made differently (method: 'int4' there, 'int8' now" in result.output
    with pytest.raises(ValueError, match="converted for int4, not int8"):
        ktforge.MoE.from_pretrained(out, layer=1, method="int8")
    layer = out / "layer-001.safetensors"
    data = bytearray(layer.read_bytes())
    data[-2] ^= 0x01  # a mantissa bit of the last bf16 value of down.scale, the last tensor
    layer.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"layer-001.safetensors: tensor 'down.scale' does not match its checksum"):
        ktforge.MoE.from_pretrained(out, layer=1)
    ktforge.MoE.from_pretrained(out, layer=1, verify=False)  # the user's explicit choice
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = 99
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format version 99; this ktforge reads version 3"):
        ktforge.MoE.from_pretrained(out, layer=2)
    manifest["format_version"] = 1  # what ktforge wrote before int4's scales were bfloat16
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format version 1 with float32 int4 scales; this ktforge reads version 3"):
        ktforge.MoE.from_pretrained(out, layer=2)


@pytest.mark.parametrize("version", [1, 2])
def test_an_int8_conversion_of_an_older_format_version_still_loads(tmp_path: Path, version: int) -> None:
    """Version 2 changed int4's scales only, version 3 added biases and the activation (which 2
    refused to convert): an int8 conversion made before either loads as it is."""
    src, out = tmp_path / "hf", tmp_path / "converted"
    write_checkpoint(src, "qwen3_moe")
    assert kt_convert(src, out, "--quant", "int8").exit_code == 0
    current = ktforge.MoE.from_pretrained(out, layer=1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = version
    del manifest["activation"], manifest["biases"]  # as the older versions wrote it
    (out / "manifest.json").write_text(json.dumps(manifest))
    older = ktforge.MoE.from_pretrained(out, layer=1)
    x, ids, weights = inputs(current.hidden_size, current.num_experts, current.top_k)
    assert np.array_equal(older.forward(x, ids, weights), current.forward(x, ids, weights))


def test_conversion_memory_is_bounded_by_a_few_experts(tmp_path: Path) -> None:
    """Experts stream through: the converter never holds a layer's float weights."""
    src = tmp_path / "hf"
    write_checkpoint(src, "qwen3_moe", E=16)
    plan = convert.plan(src, tmp_path / "out", "int8", 128, "auto", None)
    seen: list[int] = []
    original = plan.checkpoint.expert

    def tracking(layer: int, expert: int, projection: str) -> Any:
        seen.append(expert)
        return original(layer, expert, projection)

    plan.checkpoint.expert = tracking  # type: ignore[method-assign]
    consumed: list[int] = []
    with plan:
        for expert, _, _ in convert.quantized_experts(plan.checkpoint, 1, plan.options, 2, lambda *_: None):
            consumed.append(expert)
            assert max(seen) - expert <= 4  # at most 2 x threads experts in flight
    assert consumed == list(range(16))


def test_a_qwen3_config_written_by_transformers_5_names_its_experts_num_local_experts(tmp_path: Path) -> None:
    # transformers 5 saves Qwen3-MoE's expert count as num_local_experts; the Hub's files say num_experts
    write_checkpoint(tmp_path, "qwen3_moe", dtype="bf16", E=4, k=2, H=64, I=32)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_local_experts"] = config.pop("num_experts")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with Checkpoint(tmp_path) as checkpoint:
        assert (checkpoint.experts, checkpoint.top_k) == (4, 2)
    del config["num_local_experts"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="num_experts or num_local_experts must be a positive integer"):
        Checkpoint(tmp_path)
