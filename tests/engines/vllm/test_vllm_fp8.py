"""FP8 checkpoints served as they are, block-scaled (the Qwen3-*-FP8 releases' layout) and
compressed-tensors' (llm-compressor's FP8_DYNAMIC): the routed experts in their own FP8 values on
ktforge, on every host, including where vLLM itself has no CPU kernel for FP8 (its FP8 GEMMs need
AMX), there through vLLM's OpenAI server.

The reference is the same values in bf16 (the release dequantized by its own definition) on
vLLM's own kernels, which run on every host. Each prompt token's log-probability must stay far
closer to it than the model before FP8 is: within 0.3 of what quantizing moved."""

from __future__ import annotations

from typing import Any

import pytest

from tests import host
from tests.engines.vllm.environment import DriverFailed
from tests.engines.vllm.runs import TWO_RANKS, WITHOUT_AMX, close_to, offline, on_ktforge, served, vllm_own


def test_fp8_release_served_as_it_is_compiled(
    fp8_model: str, fp8_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    ours = offline(fp8_model)  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "fp8")
    assert "fp8 (group 128)" in ours["log"]
    close_to(ours, fp8_reference, bf16_reference)
    if host.has("amx_tile"):  # vLLM's own FP8 kernels run here: the same checkpoint on them
        close_to(ours, vllm_own(fp8_model, enforce_eager=True), bf16_reference)


def test_fp8_release_where_vllm_has_no_cpu_kernel_for_it(
    fp8_model: str, fp8_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm_own(fp8_model, WITHOUT_AMX, enforce_eager=True)  # vLLM alone cannot build the model
    assert "requires AMX tile support" in failed.value.log
    ours = served(fp8_model, WITHOUT_AMX)  # vllm serve, queried over the OpenAI API
    on_ktforge(ours, "fp8")
    assert "FP8 linear layers" in ours["log"] and "dequantized to bf16 at load" in ours["log"]
    close_to(ours, fp8_reference, bf16_reference)


def test_compressed_tensors_fp8_release_where_vllm_has_no_cpu_kernel_for_it(
    ct_fp8_models: tuple[str, str],
    ct_fp8_references: tuple[dict[str, Any], dict[str, Any]],
    bf16_reference: dict[str, Any],
) -> None:
    # llm-compressor's FP8_DYNAMIC: a scale per channel, attention and experts; vllm serve without AMX
    with pytest.raises(DriverFailed) as failed:
        vllm_own(ct_fp8_models[0], WITHOUT_AMX, enforce_eager=True)  # vLLM alone cannot build the model
    assert "Unsupported FP8 MoE backend" in failed.value.log
    ours = served(ct_fp8_models[0], WITHOUT_AMX)  # its linear layers on vLLM's own channel-wise FP8 kernel
    on_ktforge(ours, "fp8")
    eager, compiled = ct_fp8_references
    close_to(ours, eager, bf16_reference, compiled)


def test_fp8_release_over_two_tensor_parallel_ranks(
    fp8_model: str, fp8_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    tp = offline(fp8_model, TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "fp8")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, fp8_reference, bf16_reference)
