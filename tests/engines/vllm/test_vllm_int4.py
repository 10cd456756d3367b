"""compressed-tensors W4A16 releases (``pack-quantized`` INT4 experts in groups of 128, with zero
points and without; attention, routers and lm_head in bf16, as Kimi-K2-Thinking is) served as
they are: the routed experts in their own values on ktforge, on every host, including where vLLM
itself has no CPU kernel for them (its INT4 MoE kernels need AMX).

The reference is the release's values in bf16 (compressed-tensors' own dequantization) on vLLM's
own kernels. Each prompt token's log-probability must stay far closer to it than the bf16 model
before quantization is: within half of what quantizing moved (int4z's kernels take the activations
in int8, one scale a token)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engines.vllm.runs import INT8_ACTIVATIONS_CLOSE, TWO_RANKS, WITHOUT_AMX, close_to, offline, on_ktforge


def test_w4a16_release_served_as_it_is_compiled(
    int4_models: tuple[str, str],
    int4_reference: dict[str, Any],
    int4_compiled_reference: dict[str, Any],
    bf16_reference: dict[str, Any],
) -> None:
    ours = offline(int4_models[0])  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z")
    assert "int4z (group 128)" in ours["log"]
    close_to(ours, int4_reference, bf16_reference, int4_compiled_reference, within=INT8_ACTIVATIONS_CLOSE)


@pytest.mark.parametrize("int4_models", [False], indirect=True, ids=["asymmetric"])  # the zero points' slicing
def test_w4a16_release_over_two_ranks_without_amx(
    int4_models: tuple[str, str], int4_reference: dict[str, Any], bf16_reference: dict[str, Any]
) -> None:
    # vLLM's kernels chosen as on a CPU without AMX (its own INT4 MoE has none there); TP=2
    tp = offline(int4_models[0], WITHOUT_AMX | TWO_RANKS, enforce_eager=True, tensor_parallel_size=2)
    on_ktforge(tp, "int4z")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, int4_reference, bf16_reference, within=INT8_ACTIVATIONS_CLOSE)
