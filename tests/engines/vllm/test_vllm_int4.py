"""compressed-tensors W4A16 releases (``pack-quantized`` INT4 experts in groups of 128, with zero
points and without; attention, routers and lm_head in bf16, as Kimi-K2-Thinking is) served as
they are: the routed experts in their own values on ktforge, on every host, including where vLLM
itself has no CPU kernel for them (its INT4 MoE kernels need AMX).

The reference is the release's values in bf16 (compressed-tensors' own dequantization) on vLLM's
own kernels. Each prompt token's log-probability must stay far closer to it than the bf16 model
before quantization is: within half of what quantizing moved (int4z's kernels take the activations
in int8, one scale a token)."""

from __future__ import annotations

from tests.engines.vllm.runs import INT8_ACTIVATIONS_CLOSE, Runs, close_to, on_ktforge


def test_w4a16_release_served_as_it_is_compiled(vllm: Runs) -> None:
    ours = vllm["w4a16"]  # vLLM's default: compiled, ktforge::moe traced
    on_ktforge(ours, "int4z", group=128)
    eager, compiled = vllm["w4a16 dequantized on vllm eager"], vllm["w4a16 dequantized on vllm"]
    close_to(ours, eager, vllm["bf16 on vllm eager"], compiled, within=INT8_ACTIVATIONS_CLOSE)


def test_symmetric_w4a16_release_served_as_it_is(vllm: Runs) -> None:
    # no zero points (Kimi-K2-Thinking's kind): its own weights and scales, eager (the compiled
    # path is the zero-point release's, above)
    ours = vllm["w4a16 symmetric eager"]
    on_ktforge(ours, "int4z", group=128)
    reference = vllm["w4a16 symmetric dequantized on vllm eager"]
    close_to(ours, reference, vllm["bf16 on vllm eager"], within=INT8_ACTIVATIONS_CLOSE)


def test_w4a16_release_over_two_ranks_without_amx(vllm: Runs) -> None:
    # vLLM's kernels as its AVX2 build has them (no AMX: its own INT4 MoE has no kernel there); TP=2;
    # the release with zero points (their slicing)
    tp = vllm["w4a16 tp as the avx2 build"]
    on_ktforge(tp, "int4z")
    assert "8 experts of 256 x 128" in tp["log"]  # each rank its half of every expert's columns
    close_to(tp, vllm["w4a16 dequantized on vllm eager"], vllm["bf16 on vllm eager"], within=INT8_ACTIVATIONS_CLOSE)
