"""A GPTQ release (4-bit, symmetric, groups of 128, AutoGPTQ's layout, as most GPTQ releases are)
served as it is: the routed experts in their own values on ktforge, on every host, including
where vLLM itself has no CPU kernel for GPTQ experts (its int4 MoE kernels need AMX). The
attention's GPTQ layers stay on vLLM's own kernels, which run on every CPU.

The reference is the release's values in bf16 (AutoGPTQ's own dequantization) on vLLM's own
kernels. Each prompt token's log-probability must stay far closer to it than the bf16 model before
quantization is: within 0.3 of what quantizing moved."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engines.vllm.environment import DriverFailed
from tests.engines.vllm.runs import TWO_RANKS, WITHOUT_AMX, close_to, offline, on_ktforge, vllm_own


def test_gptq_release_served_as_it_is_compiled(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    ours = offline(gptq_models[0])  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z")
    assert "int4z (group 128)" in ours["log"]
    close_to(ours, gptq_reference, bf16_reference)


def test_gptq_release_where_vllm_has_no_cpu_kernel_for_its_experts(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm_own(gptq_models[0], WITHOUT_AMX, enforce_eager=True)  # vLLM alone cannot build the model
    assert "No WNA16 MoE backend supports the deployment configuration" in failed.value.log
    ours = offline(gptq_models[0], WITHOUT_AMX, enforce_eager=True)
    on_ktforge(ours, "int4z")
    close_to(ours, gptq_reference, bf16_reference)


def test_gptq_release_over_two_tensor_parallel_ranks(
    gptq_models: tuple[str, str], gptq_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    tp = offline(gptq_models[0], TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "int4z")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, gptq_reference, bf16_reference)
