"""The vLLM runs the tests compare: driver.py in vLLM's own environment, with ktforge's plugin on
(as a user has it) or off (vLLM's own kernels, the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.engines.vllm.environment import drive

HERE = Path(__file__).parent
AMX_PERMISSION = str(HERE / "amx_permission")
WITHOUT_AMX = {"PYTHONPATH": str(HERE / "vllm_without_amx")}  # vLLM's kernel choice as on a CPU without AMX
AVX2_BUILD = {"PYTHONPATH": str(HERE / "vllm_avx2_build")}  # and vLLM's kernels as its AVX2-only build has them
TWO_RANKS = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one core a rank (vLLM's auto binding reserves one)


def offline(model: str, env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    return drive("offline", model, json.dumps(kwargs), env=env)


def served(model: str, env: dict[str, str] | None = None, *args: str) -> dict[str, Any]:
    """``model`` behind vLLM's OpenAI server, as users run it (compiled), queried with the openai
    client: completions and chat, streamed and not, several at once; and each prompt's greedy
    tokens and prompt log-probabilities, as ``offline`` gives them."""
    reply = drive("serve", model, *args, env=env)
    completions = reply["completions"]
    assert all(isinstance(text, str) for text in completions), completions
    assert reply["streamed"] == completions[0]  # streaming gives the same greedy text
    assert reply["concurrent"] == completions * 2  # batched together, each as alone
    if reply["chat"] is not None:  # (not asked of gpt-oss: see driver.py)
        assert reply["chat_tokens"] > 0 and reply["streamed_chat"] == reply["chat"]
    return reply


def vllm_own(model: str, env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    """The same run with the plugin off: vLLM's own kernels."""
    return offline(model, {"KTFORGE_VLLM": "0", "PYTHONPATH": AMX_PERMISSION, **(env or {})}, **kwargs)


def on_ktforge(run: dict[str, Any], method: str) -> None:
    """Every routed-experts layer of every rank ran on ktforge in ``method``, vLLM's copy freed
    (a server's run: its log says they run on ktforge)."""
    assert f"run their routed experts on ktforge: {method}" in run["log"]
    if "layers" not in run:  # the server's workers are not reachable from the client
        assert "runs vLLM's own" not in run["log"]  # no layer fell back
        return
    layers = [layer for rank in run["layers"] for layer in rank]
    assert layers, "no routed-experts layer found"
    for layer in layers:
        assert layer["on_ktforge"], layer
        assert layer["kt_method"] == method, layer
        assert layer["vllm_weight_elements"] == 0, layer  # one copy of the experts: ktforge's


def logprob_gap(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    """The largest difference of a prompt token's log-probability between two runs."""
    prompts = zip(ours["prompt_logprobs"], theirs["prompt_logprobs"], strict=True)
    pairs = [pair for p, q in prompts for pair in zip(p, q, strict=True)]
    assert pairs
    return max(abs(a - b) for a, b in pairs)


CLOSE = 0.3  # of the gap between the bf16 model and its quantized release
# int4z's kernels take the activations in int8 (one scale a token), on top of the file's values
INT8_ACTIVATIONS_CLOSE = 0.5


def close_to(
    run: dict[str, Any],
    reference: dict[str, Any],
    bf16_reference: dict[str, Any],
    compiled_reference: dict[str, Any] | None = None,
    within: float = CLOSE,
) -> None:
    """``run`` gives each prompt token a log-probability far closer to ``reference`` (a release's
    own values in bf16 on vLLM's kernels, eager) than the bf16 model before quantization does.
    A compiled run is held to the same values compiled (``compiled_reference``): inductor's own
    rounding moves vLLM's bf16 model by up to half of what quantizing only the experts moves it."""
    moved = logprob_gap(bf16_reference, reference)  # what quantization changed
    assert moved > 0.1  # the test can tell the two apart
    target = compiled_reference or reference
    gap = logprob_gap(run, target)
    assert gap < within * moved, (
        f"{gap:.3f} from the release's values, over {within} of the {moved:.3f} quantizing moved"
    )
    assert [t[0] for t in run["tokens"]] == [t[0] for t in target["tokens"]]
