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

from typing import Any

import pytest

from tests.engines.vllm.environment import DriverFailed
from tests.engines.vllm.runs import (
    AVX2_BUILD,
    INT8_ACTIVATIONS_CLOSE,
    TWO_RANKS,
    WITHOUT_AMX,
    close_to,
    offline,
    on_ktforge,
    served,
    vllm_own,
)


def test_gptq_release_served_as_it_is_compiled(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    ours = offline(gptq_models[0])  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z")
    assert "int4z (group 128)" in ours["log"]
    close_to(ours, gptq_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)


def test_gptq_release_where_vllm_has_no_cpu_kernel_for_it(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm_own(gptq_models[0], WITHOUT_AMX, enforce_eager=True)  # vLLM alone cannot build the model
    assert "No WNA16 MoE backend supports the deployment configuration" in failed.value.log
    # an AVX2-only CPU as vLLM sees it: no AMX, and no GPTQ linear kernel in its build
    ours = served(gptq_models[0], AVX2_BUILD)  # vllm serve, queried over the OpenAI API
    on_ktforge(ours, "int4z")
    assert "GPTQ linear layers are dequantized to bfloat16 at load" in ours["log"]
    close_to(ours, gptq_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)


def test_gptq_release_over_two_tensor_parallel_ranks(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    tp = offline(gptq_models[0], TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "int4z")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, gptq_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)


def test_awq_release_served_as_it_is(
    awq_models: tuple[str, str], awq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    ours = offline(awq_models[0])  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z")
    close_to(ours, awq_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)
    # as vLLM's AVX2-only build has it (no AMX, no AWQ linear kernel: those layers dequantized), TP=2
    tp = offline(awq_models[0], AVX2_BUILD | TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "int4z")
    assert "AWQ linear layers are dequantized to bfloat16 at load" in tp["log"]
    close_to(tp, awq_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)
