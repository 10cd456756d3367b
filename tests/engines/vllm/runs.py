"""The vLLM runs the tests compare, declared in one table (``plan``) and run together once a
session: driver.py in vLLM's own environment, with ktforge's plugin on (as a user has it) or off
(vLLM's own kernels, the reference).

A vLLM process costs far more to start (imports, an engine process, a worker process) than a
tiny model costs to load, compile and run. So the offline runs of one setting and one rank count
share one process, one after another, with vLLM's engine in that process (and the worker too at
one rank: two ranks spawn theirs); the OpenAI servers are processes of their own, as users
start them. Each process is pinned to a core a rank, and as many run at once as there are
cores for them: the two-rank ones (tensor and expert parallel) first, then the single-rank ones,
longest first. Where vLLM finds no AMX anyway, the runs that hide it from vLLM share the plain
runs' process (``sharing``)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import host
from tests.engines.vllm.environment import DriverFailed, drive, drive_batch

HERE = Path(__file__).parent
AMX_PERMISSION = str(HERE / "amx_permission")
WITHOUT_AMX = str(HERE / "vllm_without_amx")  # vLLM's kernel choice as on a CPU without AMX
AVX2_BUILD = str(HERE / "vllm_avx2_build")  # and vLLM's kernels as its AVX2-only build has them

SETTINGS: dict[str, dict[str, str]] = {
    "vllm": {"KTFORGE_VLLM": "0", "PYTHONPATH": AMX_PERMISSION},  # the plugin off: vLLM's own kernels
    "vllm without amx": {"KTFORGE_VLLM": "0", "PYTHONPATH": WITHOUT_AMX},
    "ktforge": {},  # the plugin on, as pip install ktforge leaves it
    "ktforge without amx": {"PYTHONPATH": WITHOUT_AMX},
    "ktforge avx2 build": {"PYTHONPATH": AVX2_BUILD},
}
EAGER = {"enforce_eager": True}
TWO_RANKS = {"enforce_eager": True, "tensor_parallel_size": 2}
ONLINE_INT4 = {"quantization_config": {"quant_method": "ktforge", "method": "int4", "group_size": 64}}


@dataclass(frozen=True)
class Run:
    """One model in one setting: through vLLM's offline ``LLM`` with ``llm`` as its arguments
    (compiled unless they say ``enforce_eager``), or behind ``vllm serve`` with ``serve`` as its
    arguments (queried with the openai client). ``fails``: vLLM is expected to refuse the model."""

    model: str  # a checkpoint of conftest's ``checkpoints``
    setting: str  # a key of SETTINGS
    llm: Mapping[str, Any] = field(default_factory=dict)
    serve: tuple[str, ...] | None = None
    fails: bool = False

    @property
    def ranks(self) -> int:
        if self.serve is not None and "--tensor-parallel-size" in self.serve:
            return int(self.serve[self.serve.index("--tensor-parallel-size") + 1])
        return int(self.llm.get("tensor_parallel_size", 1))


def plan() -> dict[str, Run]:
    """Every run the tests read, by name."""
    runs = {
        # bf16 (Qwen3-MoE as transformers saves it)
        "bf16 on vllm eager": Run("bf16", "vllm", EAGER),
        "bf16 on vllm": Run("bf16", "vllm"),
        "bf16": Run("bf16", "ktforge"),
        "bf16 tp on vllm": Run("bf16", "vllm", TWO_RANKS),
        "bf16 tp": Run("bf16", "ktforge", TWO_RANKS),
        "bf16 ep": Run("bf16", "ktforge", TWO_RANKS | {"enable_expert_parallel": True}),
        "bf16 as online int4": Run("bf16", "ktforge", EAGER | {"quantization": "ktforge", "hf_overrides": ONLINE_INT4}),
        "bf16 served without amx": Run("bf16", "ktforge without amx", serve=()),
        # FP8 with 128 x 128 block scales
        "fp8": Run("fp8", "ktforge"),
        "fp8 tp": Run("fp8", "ktforge", TWO_RANKS),
        "fp8 served without amx": Run("fp8", "ktforge without amx", serve=()),
        "fp8 on vllm without amx": Run("fp8", "vllm without amx", EAGER, fails=True),
        "fp8 dequantized on vllm eager": Run("fp8 dequantized", "vllm", EAGER),
        # compressed-tensors FP8_DYNAMIC
        "ct fp8 without amx": Run("ct fp8", "ktforge without amx"),
        "ct fp8 on vllm without amx": Run("ct fp8", "vllm without amx", EAGER, fails=True),
        "ct fp8 bf16 experts on vllm without amx eager": Run("ct fp8 bf16 experts", "vllm without amx", EAGER),
        "ct fp8 bf16 experts on vllm without amx": Run("ct fp8 bf16 experts", "vllm without amx"),
        # GPTQ and AWQ
        "gptq": Run("gptq", "ktforge"),
        "gptq tp": Run("gptq", "ktforge", TWO_RANKS),
        "gptq served as the avx2 build": Run("gptq", "ktforge avx2 build", serve=()),
        "gptq on vllm without amx": Run("gptq", "vllm without amx", EAGER, fails=True),
        "gptq dequantized on vllm eager": Run("gptq dequantized", "vllm", EAGER),
        "gptq act-order": Run("gptq act-order", "ktforge"),
        "gptq act-order ep": Run("gptq act-order", "ktforge", TWO_RANKS | {"enable_expert_parallel": True}),
        "gptq act-order tp": Run("gptq act-order", "ktforge", TWO_RANKS),
        "gptq act-order on vllm": Run("gptq act-order", "vllm", EAGER, fails=True),
        "gptq act-order dequantized on vllm eager": Run("gptq act-order dequantized", "vllm", EAGER),
        "awq": Run("awq", "ktforge"),
        "awq tp as the avx2 build": Run("awq", "ktforge avx2 build", TWO_RANKS),
        "awq dequantized on vllm eager": Run("awq dequantized", "vllm", EAGER),
        # gpt-oss MXFP4
        "gpt-oss": Run("gpt-oss", "ktforge"),
        "gpt-oss served tp without amx": Run("gpt-oss", "ktforge without amx", serve=("--tensor-parallel-size", "2")),
        "gpt-oss dequantized on vllm eager": Run("gpt-oss dequantized", "vllm", EAGER),
        "gpt-oss dequantized on vllm": Run("gpt-oss dequantized", "vllm"),
        "gpt-oss bf16 on vllm eager": Run("gpt-oss bf16", "vllm", EAGER),
        # compressed-tensors W4A16 (zero points; symmetric)
        "w4a16 tp as the avx2 build": Run("w4a16", "ktforge avx2 build", TWO_RANKS),
    }
    for w4a16 in ("w4a16", "w4a16 symmetric"):
        runs[f"{w4a16} dequantized on vllm eager"] = Run(f"{w4a16} dequantized", "vllm", EAGER)
    runs["w4a16"] = Run("w4a16", "ktforge")
    runs["w4a16 dequantized on vllm"] = Run("w4a16 dequantized", "vllm")
    # the same layer, method and apply without zero points: compiled once is enough (above)
    runs["w4a16 symmetric eager"] = Run("w4a16 symmetric", "ktforge", EAGER)
    if host.has("amx_tile"):  # vLLM's own FP8 MoE kernels run here: the same checkpoint on them
        runs["fp8 on vllm eager"] = Run("fp8", "vllm", EAGER)
    return runs


class Runs(Mapping[str, dict[str, Any]]):
    """Each run's result (``tokens``, ``prompt_logprobs``, ``layers`` or the server's replies;
    ``log``: what its processes printed while it ran); reading a failed run raises DriverFailed."""

    def __init__(self, results: dict[str, dict[str, Any] | DriverFailed]) -> None:
        self._results = results

    def __getitem__(self, name: str) -> dict[str, Any]:
        value = self._results[name]
        if isinstance(value, DriverFailed):
            raise DriverFailed(str(value), value.log)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)


def sharing(setting: str) -> str:
    """The setting whose process a run of ``setting`` joins: hiding AMX from vLLM changes nothing
    where torch (vLLM's own test) finds none, so there the "without amx" runs join the plain ones."""
    import torch

    plain = setting.removesuffix(" without amx")
    return plain if plain in SETTINGS and not torch.cpu._is_amx_tile_supported() else setting


def execute(runs: Mapping[str, Run], checkpoints: Mapping[str, str]) -> Runs:
    """Every run, the processes as the module's text says."""
    cpus = sorted(os.sched_getaffinity(0))
    results: dict[str, dict[str, Any] | DriverFailed] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ktforge-vllm-runs-"))

    def job(names: list[str], bound: list[int]) -> dict[str, dict[str, Any] | DriverFailed]:
        first = runs[names[0]]
        # one core a rank (vLLM's auto binding would reserve one)
        env = SETTINGS[sharing(first.setting)] | {"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, bound))}
        if first.serve is not None:
            try:
                return {names[0]: served(checkpoints[first.model], env, *first.serve)}
            except DriverFailed as failed:
                return {names[0]: failed}
        listing = scratch / f"{sharing(first.setting)} {first.ranks}.json"
        # expected failures last: a model vLLM refused may leave its process unfit for another
        ordered = sorted(names, key=lambda name: runs[name].fails)
        listing.write_text(
            json.dumps([{"name": n, "model": checkpoints[runs[n].model], "llm": dict(runs[n].llm)} for n in ordered])
        )
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in the driver's process (a rank too, at TP=1)
        return drive_batch(str(listing), env=env, timeout=300 + 150 * len(names))

    groups: dict[tuple[str, int], list[str]] = {}
    jobs: list[list[str]] = []
    for name, run in runs.items():
        if run.serve is not None:
            jobs.append([name])
        else:
            groups.setdefault((sharing(run.setting), run.ranks), []).append(name)
    jobs += groups.values()
    if any(runs[names[0]].ranks > len(cpus) for names in jobs):
        raise RuntimeError(f"the two-rank runs need two CPUs; this process may use {cpus}")

    def cost(names: list[str]) -> float:  # seconds, as measured on a Zen 4: a process, then its runs
        first = runs[names[0]]
        if first.serve is not None:
            return 60.0
        return 30 + sum(13 if first.ranks > 1 else 4 if runs[n].llm.get("enforce_eager") else 12 for n in names)

    # the two-rank jobs first (each holds every core of a 2-core machine), then the longest first;
    # each job waits for a core a rank, and none starts before the jobs ahead of it
    order = sorted(jobs, key=lambda names: (runs[names[0]].ranks, cost(names)), reverse=True)
    free, turn = list(cpus), [0]
    ready = threading.Condition()

    def pinned(index: int) -> dict[str, dict[str, Any] | DriverFailed]:
        names = order[index]
        with ready:
            ready.wait_for(lambda: turn[0] == index and len(free) >= runs[names[0]].ranks)
            bound = [free.pop(0) for _ in range(runs[names[0]].ranks)]
            turn[0] += 1
            ready.notify_all()
        try:
            return job(names, bound)
        finally:
            with ready:
                free.extend(bound)
                free.sort()
                ready.notify_all()

    with concurrent.futures.ThreadPoolExecutor(len(cpus)) as pool:
        for done in pool.map(pinned, range(len(order))):
            results |= done
    return Runs(results)


def served(model: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    """``model`` behind vLLM's OpenAI server, as users run it (compiled), queried with the openai
    client: completions and chat, streamed and not, several at once; and each prompt's greedy
    tokens and prompt log-probabilities, as an offline run gives them."""
    reply = drive("serve", model, *args, env=env)
    completions = reply["completions"]
    assert all(isinstance(text, str) for text in completions), completions
    assert reply["streamed"] == completions[0]  # streaming gives the same greedy text
    assert reply["concurrent"] == completions * 2  # batched together, each as alone
    if reply["chat"] is not None:  # (not asked of gpt-oss: see driver.py)
        assert reply["chat_tokens"] > 0 and reply["streamed_chat"] == reply["chat"]
    return reply


def on_ktforge(run: dict[str, Any], method: str, group: int | None = None) -> None:
    """Every routed-experts layer of every rank ran on ktforge in ``method`` (in groups of
    ``group``), vLLM's copy freed (a server's run: its log says they run on ktforge)."""
    if "layers" not in run:  # the server's workers are not reachable from the client
        assert f"run their routed experts on ktforge: {method}" in run["log"]
        if group is not None:
            assert f"{method} (group {group})" in run["log"]
        assert "runs vLLM's own" not in run["log"]  # no layer fell back
        return
    layers = [layer for rank in run["layers"] for layer in rank]
    assert layers, "no routed-experts layer found"
    for layer in layers:
        assert layer["on_ktforge"], layer
        assert layer["kt_method"] == method, layer
        assert group is None or layer["kt_group"] == group, layer
        assert layer["vllm_weight_elements"] == 0, layer  # one copy of the experts: ktforge's


def on_vllm(run: dict[str, Any]) -> None:
    """No layer ran on ktforge (a reference run)."""
    layers = [layer for rank in run["layers"] for layer in rank]
    assert layers and not any(layer["on_ktforge"] for layer in layers), layers


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
    same_first_tokens(run, target)


def same_first_tokens(run: dict[str, Any], reference: dict[str, Any]) -> None:
    """Each prompt's first greedy token is the reference's wherever the reference's choice is clear:
    its top two apart by more than twice the run's largest log-probability difference from it (each
    may move by that much, in opposite directions). Closer than that it is a near tie, which the
    run's rounding may turn (gpt-oss's MXFP4 over two ranks on a Zen 3: 14 or 147 on one prompt)."""
    gap = logprob_gap(run, reference)
    pairs = zip(run["tokens"], reference["tokens"], reference["first_margins"], strict=True)
    turned = [(mine[0], theirs[0], margin) for mine, theirs, margin in pairs if mine[0] != theirs[0]]
    assert all(margin < 2 * gap for _, _, margin in turned), (turned, gap)
