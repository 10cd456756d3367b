"""The GGUF architectures of MoE models: sizes, top-k and routing read from each file's own
metadata, as llama.cpp's converter names the keys. Each file is written here by gguf-py's
GGUFWriter with the expert tensors of the llama.cpp-quantized Q4_K fixture (their bytes and
type as they are) under that architecture's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import ktforge
from ktforge.checkpoints.gguf import GgufCheckpoint, GgufError, Routing, architectures

from .serving import inputs
from .test_gguf_checkpoints import K_TOP, E, H, I, fixture


def write(path: Path, arch: str, keys: dict[str, Any], biases: bool = False, layer: int = 0) -> Path:
    """A GGUF of ``arch`` whose layer ``layer`` holds the Q4_K fixture's experts."""
    source = gguf.GGUFReader(fixture("Q4_K"))
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layer + 1)
    writer.add_embedding_length(H)
    writer.add_expert_count(E)
    writer.add_expert_used_count(K_TOP)
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        elif isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    for t in source.tensors:
        if "_exps" in t.name:
            writer.add_tensor(t.name.replace("blk.0.", f"blk.{layer}."), np.asarray(t.data), raw_dtype=t.tensor_type)
    if biases:
        rng = np.random.default_rng(3)
        for projection, n in (("gate", I), ("up", I), ("down", H)):
            writer.add_tensor(f"blk.{layer}.ffn_{projection}_exps.bias", rng.standard_normal((E, n)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


ARCHITECTURES = {
    # arch: (metadata keys, expected routing)
    "qwen3moe": ({"expert_feed_forward_length": I}, Routing(K_TOP, "softmax", True, experts=E)),
    "qwen2moe": ({"expert_feed_forward_length": I}, Routing(K_TOP, "softmax", False, experts=E)),
    "llama": ({"feed_forward_length": I}, Routing(K_TOP, "softmax", True, experts=E)),  # Mixtral
    "deepseek2": (
        {
            "expert_feed_forward_length": I,
            "expert_gating_func": 2,
            "expert_weights_norm": True,
            "expert_weights_scale": 2.5,
        },
        Routing(K_TOP, "sigmoid", True, 2.5, E),
    ),
    "glm4moe": (
        {"expert_feed_forward_length": I, "expert_weights_scale": 1.5},
        Routing(K_TOP, "sigmoid", True, 1.5, E),
    ),
    "gpt-oss": ({"expert_feed_forward_length": I}, Routing(K_TOP, "softmax_selected", False, experts=E)),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_reads_its_sizes_and_routing_from_the_metadata(tmp_path: Path, arch: str) -> None:
    keys, routing = ARCHITECTURES[arch]
    path = write(tmp_path / f"{arch}.gguf", arch, keys, biases=arch == "gpt-oss", layer=2)
    with GgufCheckpoint(path) as checkpoint:
        assert (checkpoint.experts, checkpoint.top_k, checkpoint.hidden, checkpoint.intermediate) == (E, K_TOP, H, I)
        assert checkpoint.moe_layers == [2] and checkpoint.routing == routing
    moe = ktforge.MoE.from_pretrained(path, 2, backend="reference")
    assert moe.routing == routing and moe.method == "q4_k"
    x, ids, w = inputs(5, E, K_TOP, H)
    plain = ktforge.MoE.from_pretrained(fixture("Q4_K"), 0, backend="reference").forward(x, ids, w)
    got = moe.forward(x, ids, w)
    if arch == "gpt-oss":  # its biases and clamped activation (alpha 1.702, limit 7, up + 1) change the layer
        assert not np.allclose(got, plain)
    else:
        assert np.array_equal(got, plain)


def test_a_file_without_experts_or_of_another_architecture_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GgufError, match=r"metadata qwen3moe.expert_feed_forward_length is None"):
        GgufCheckpoint(write(tmp_path / "a.gguf", "qwen3moe", {}))
    with pytest.raises(GgufError, match=r"architecture 'mamba' is not one whose experts ktforge reads"):
        GgufCheckpoint(write(tmp_path / "b.gguf", "mamba", {}))


DEEPSEEK = {"expert_feed_forward_length": I, "expert_gating_func": 2, "expert_weights_norm": True}
BAD_METADATA = {  # key: (the value written by gguf-py, what the refusal says it must be)
    "expert_gating_func": (7, r"not 0 or one of 1 \(softmax\), 2 \(sigmoid\), 3 \(softmax_selected\)"),
    "expert_weights_norm": ("false", "not a bool"),
    "expert_weights_scale": (float("nan"), "not a finite scale >= 0"),
    "expert_feed_forward_length": (2**31, "not a positive integer below 2"),
}


@pytest.mark.parametrize("key", sorted(BAD_METADATA))
def test_metadata_of_the_wrong_type_or_range_is_refused_naming_the_key(tmp_path: Path, key: str) -> None:
    value, why = BAD_METADATA[key]
    path = write(tmp_path / "bad.gguf", "deepseek2", {**DEEPSEEK, key: value})
    with pytest.raises(GgufError, match=rf"metadata deepseek2\.{key} is .*, {why}"):
        GgufCheckpoint(path)


def test_gating_code_0_is_the_architectures_own(tmp_path: Path) -> None:
    """0 (llama.cpp's NONE) reads as unset, as llama.cpp reads older DeepSeek-V2 files."""
    path = write(tmp_path / "zero.gguf", "deepseek2", {**DEEPSEEK, "expert_gating_func": 0})
    with GgufCheckpoint(path) as checkpoint:
        assert checkpoint.routing.gating == architectures()["deepseek2"]["gating"]


def test_layers_come_from_the_tensors_not_from_block_count(tmp_path: Path) -> None:
    """A block_count of 2^32 - 1 (probing each index hung) lists the layers the file holds."""
    path = write(tmp_path / "many.gguf", "qwen3moe", {"expert_feed_forward_length": I}, layer=3)
    raw = bytearray(path.read_bytes())
    at = raw.index(b"qwen3moe.block_count") + len(b"qwen3moe.block_count") + 4  # the key, then its uint32 type
    raw[at : at + 4] = (2**31 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with GgufCheckpoint(path) as checkpoint:
        assert checkpoint.moe_layers == [3]


def test_route_checks_its_logits_as_forward_checks_its_inputs() -> None:
    routing = Routing(2, "softmax", True, experts=4)
    with pytest.raises(ValueError, match=r"logits must be \[tokens, 4\] finite numbers, got shape \(3, 6\)"):
        routing.route(np.zeros((3, 6)))  # ids beyond the layer's 4 experts
    with pytest.raises(ValueError, match="with NaN or infinity"):
        routing.route(np.array([[0.0, np.nan, 1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        routing.route(np.zeros(4))
    with pytest.raises(ValueError, match=r"bias must be \[4\] finite numbers"):
        routing.route(np.zeros((1, 4)), bias=np.zeros(5))
    ids, _ = routing.route(np.arange(8.0).reshape(2, 4))
    assert ids.tolist() == [[3, 2], [3, 2]]


def softmax(z: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_routing_gives_each_gating_its_experts_and_weights() -> None:
    logits = np.random.default_rng(4).standard_normal((7, 8))
    top = np.argsort(-logits, axis=-1)[:, :3]  # every gating here is monotonic in the logits
    for routing, weights in (
        (Routing(3, "softmax", False), np.take_along_axis(softmax(logits), top, -1)),
        (Routing(3, "softmax_selected", False), softmax(np.take_along_axis(logits, top, -1))),
        (Routing(3, "sigmoid", False, 2.0), 2.0 / (1 + np.exp(-np.take_along_axis(logits, top, -1)))),
    ):
        ids, w = routing.route(logits)
        assert np.array_equal(ids, top) and np.allclose(w, weights, rtol=1e-6)
    ids, w = Routing(3, "softmax", True).route(logits)
    assert np.allclose(w.sum(axis=-1), 1.0)
    bias = np.zeros(8)
    bias[top[0, 2]] = -100.0  # a correction bias changes the choice, not the weights
    ids, w = Routing(3, "sigmoid", False).route(logits, bias)
    assert top[0, 2] not in ids[0]
    assert np.allclose(w[0], 1 / (1 + np.exp(-logits[0, ids[0]])), rtol=1e-6)
