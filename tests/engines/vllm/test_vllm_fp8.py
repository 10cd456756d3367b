"""FP8 checkpoints served as they are, block-scaled (the Qwen3-*-FP8 releases' layout) and
compressed-tensors' (llm-compressor's FP8_DYNAMIC): the routed experts in their own FP8 values on
ktforge, on every host, including where vLLM itself has no CPU kernel for FP8 (its FP8 GEMMs need
AMX), there through vLLM's OpenAI server.

The reference is the same values in bf16 (the release dequantized by its own definition) on
vLLM's own kernels, which run on every host. Each prompt token's log-probability must stay far
closer to it than the model before FP8 is: within 0.3 of what quantizing moved."""

from __future__ import annotations

import pytest

from tests import host
from tests.engines.vllm.environment import DriverFailed
from tests.engines.vllm.runs import Runs, close_to, on_ktforge


def test_fp8_release_served_as_it_is_compiled(vllm: Runs) -> None:
    ours, reference, bf16 = vllm["fp8"], vllm["fp8 dequantized on vllm eager"], vllm["bf16 on vllm eager"]
    on_ktforge(ours, "fp8", group=128)  # vLLM's default: compiled, ktforge::moe traced
    close_to(ours, reference, bf16)
    if host.has("amx_tile"):  # vLLM's own FP8 kernels run here: the same checkpoint on them
        close_to(ours, vllm["fp8 on vllm eager"], bf16)


def test_fp8_release_where_vllm_has_no_cpu_kernel_for_it(vllm: Runs) -> None:
    with pytest.raises(DriverFailed) as failed:
        vllm["fp8 on vllm without amx"]  # vLLM alone cannot build the model
    assert "requires AMX tile support" in failed.value.log
    ours = vllm["fp8 served without amx"]  # vllm serve, queried over the OpenAI API
    on_ktforge(ours, "fp8")
    assert "FP8 linear layers" in ours["log"] and "dequantized to bf16 at load" in ours["log"]
    close_to(ours, vllm["fp8 dequantized on vllm eager"], vllm["bf16 on vllm eager"])


def test_compressed_tensors_fp8_release_where_vllm_has_no_cpu_kernel_for_it(vllm: Runs) -> None:
    # llm-compressor's FP8_DYNAMIC: a scale per channel, attention and experts; without AMX
    with pytest.raises(DriverFailed) as failed:
        vllm["ct fp8 on vllm without amx"]  # vLLM alone cannot build the model
    assert "Unsupported FP8 MoE backend" in failed.value.log
    ours = vllm["ct fp8 without amx"]  # compiled; its linear layers on vLLM's own channel-wise FP8 kernel
    on_ktforge(ours, "fp8")
    # held to the reference compiled too: vLLM's compiled W8A8 attention alone moves this model
    # by more than FP8 moved it (its fused norm and FP8 quantization)
    reference = "ct fp8 bf16 experts on vllm without amx"
    eager, compiled = vllm[f"{reference} eager"], vllm[reference]
    close_to(ours, eager, vllm["bf16 on vllm eager"], compiled)


def test_fp8_release_over_two_tensor_parallel_ranks(vllm: Runs) -> None:
    tp = vllm["fp8 tp"]
    on_ktforge(tp, "fp8")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, vllm["fp8 dequantized on vllm eager"], vllm["bf16 on vllm eager"])
