"""gpt-oss's MXFP4 release (fused E2M1 blocks and E8M0 scales, expert biases, gpt-oss's clamped
activation; attention with sinks and sliding windows in bf16) served as it is: the routed experts
in their own values on ktforge's mxfp4 kernels, compiled, and at TP=2 without AMX behind vLLM's
OpenAI server.

The reference is the release's values in bf16 (transformers' own dequantization) on vLLM's own
kernels. Each prompt token's log-probability must stay far closer to it than the bf16 model before
quantization is: within 0.3 of what quantizing moved."""

from __future__ import annotations

from tests.engines.vllm.runs import Runs, close_to, on_ktforge


def test_gpt_oss_mxfp4_release_served_as_it_is_compiled(vllm: Runs) -> None:
    ours = vllm["gpt-oss"]  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "mxfp4")
    eager, compiled = vllm["gpt-oss dequantized on vllm eager"], vllm["gpt-oss dequantized on vllm"]
    close_to(ours, eager, vllm["gpt-oss bf16 on vllm eager"], compiled)


def test_gpt_oss_mxfp4_release_over_two_ranks_without_amx(vllm: Runs) -> None:
    # vllm serve --tensor-parallel-size 2, queried over the OpenAI API
    tp = vllm["gpt-oss served tp without amx"]
    on_ktforge(tp, "mxfp4")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, vllm["gpt-oss dequantized on vllm eager"], vllm["gpt-oss bf16 on vllm eager"])
