"""A GPTQ release (4-bit, symmetric, groups of 128, AutoGPTQ's layout, as most GPTQ releases are)
and an AWQ one (AutoAWQ's GEMM layout, zero points) served as they are: the routed experts in
their own values on ktforge, on every host, including where vLLM itself has no CPU kernel for them
(its int4 MoE kernels need AMX). The attention's GPTQ/AWQ layers stay on vLLM's own kernel where
its build has one (AVX-512), and are dequantized to bf16 at load where it has none (its AVX2-only
build).

The reference is each release's values in bf16 (the tool's own dequantization) on vLLM's own
kernels. Each prompt token's log-probability must stay far closer to it than the bf16 model before
quantization is: within half of what quantizing moved (int4z's kernels take the activations
in int8, one scale a token)."""

from __future__ import annotations

import pytest

from tests.engines.vllm.environment import DriverFailed
from tests.engines.vllm.runs import INT8_ACTIVATIONS_CLOSE, Runs, close_to, on_ktforge


def test_gptq_release_served_as_it_is_compiled(vllm: Runs) -> None:
    ours = vllm["gptq"]  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z", group=128)
    close_to(ours, vllm["gptq dequantized on vllm eager"], vllm["bf16 on vllm eager"], within=INT8_ACTIVATIONS_CLOSE)


def test_gptq_release_where_vllm_has_no_cpu_kernel_for_it(vllm: Runs) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm["gptq on vllm without amx"]  # vLLM alone cannot build the model
    assert "No WNA16 MoE backend supports the deployment configuration" in failed.value.log
    # an AVX2-only CPU as vLLM sees it: no AMX, and no GPTQ linear kernel in its build
    ours = vllm["gptq served as the avx2 build"]  # vllm serve, queried over the OpenAI API
    on_ktforge(ours, "int4z")
    assert "GPTQ linear layers are dequantized to bfloat16 at load" in ours["log"]
    close_to(ours, vllm["gptq dequantized on vllm eager"], vllm["bf16 on vllm eager"], within=INT8_ACTIVATIONS_CLOSE)


def test_gptq_release_over_two_tensor_parallel_ranks(vllm: Runs) -> None:
    tp = vllm["gptq tp"]
    on_ktforge(tp, "int4z")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, vllm["gptq dequantized on vllm eager"], vllm["bf16 on vllm eager"], within=INT8_ACTIVATIONS_CLOSE)


def test_gptq_release_with_act_order_and_zero_points_which_vllm_refuses(vllm: Runs) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm["gptq act-order on vllm"]  # vLLM refuses act-order for every layer, on every platform
    assert "GPTQ group activation ordering (desc_act=True) is no longer supported" in failed.value.log
    reference, bf16 = vllm["gptq act-order dequantized on vllm eager"], vllm["bf16 on vllm eager"]
    ours = vllm["gptq act-order"]  # compiled; each expert's input in its own order
    on_ktforge(ours, "int4z", group=128)
    assert "GPTQ linear layers are dequantized to bfloat16 at load" in ours["log"]
    close_to(ours, reference, bf16, within=INT8_ACTIVATIONS_CLOSE)
    # two ranks: whole experts a rank (expert parallel), attention split (its o_proj's inputs halved)
    ep = vllm["gptq act-order ep"]
    on_ktforge(ep, "int4z")
    assert "4 experts of 256 x 256" in ep["log"]
    close_to(ep, reference, bf16, within=INT8_ACTIVATIONS_CLOSE)
    # tensor parallel: each rank's half of down's inputs holds parts of every group, made whole
    # groups again on the rank (zero weights for the padding)
    tp = vllm["gptq act-order tp"]
    on_ktforge(tp, "int4z")
    assert "made whole groups of" in tp["log"]
    close_to(tp, reference, bf16, within=INT8_ACTIVATIONS_CLOSE)


def test_awq_release_served_as_it_is(vllm: Runs) -> None:
    reference, bf16 = vllm["awq dequantized on vllm eager"], vllm["bf16 on vllm eager"]
    ours = vllm["awq"]  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z")
    close_to(ours, reference, bf16, within=INT8_ACTIVATIONS_CLOSE)
    # as vLLM's AVX2-only build has it (no AMX, no AWQ linear kernel: those layers dequantized), TP=2
    tp = vllm["awq tp as the avx2 build"]
    on_ktforge(tp, "int4z")
    assert "AWQ linear layers are dequantized to bfloat16 at load" in tp["log"]
    close_to(tp, reference, bf16, within=INT8_ACTIVATIONS_CLOSE)
