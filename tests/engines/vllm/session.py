"""The session's vLLM work: the tiny checkpoints, written by the real tools, and every run of
runs.py's plan over them, started as soon as the session knows it needs them (tests/conftest.py)
and run in a thread of their own beside the rest of the suite.

The runs take minutes, mostly in vLLM processes that start, compile and wait on each other:
a core the suite leaves idle meanwhile does the rest of the suite's work. The fixtures wait for
the result; a failure is raised where a test reads it."""

from __future__ import annotations

import concurrent.futures
import shutil
import tempfile
import threading
from pathlib import Path

from tests.engines.vllm.environment import drive
from tests.engines.vllm.runs import Runs, execute, plan
from tests.fp8_checkpoints import ct_fp8_release, dequantized_copy, fp8_copy
from tests.gptq_awq_checkpoints import gptq_awq_release
from tests.int4_checkpoints import int4_release
from tests.mxfp4_checkpoints import gpt_oss_dequantized, gpt_oss_release

_lock = threading.Lock()
_work: concurrent.futures.Future[tuple[dict[str, str], Runs]] | None = None
_root: Path | None = None


def write_checkpoints(root: Path) -> dict[str, str]:
    """Each checkpoint by name, under ``root``, and each release's values in bf16 by the tool's
    own dequantization ("... dequantized"): what vLLM's bf16 path runs as the reference.

    - bf16: Qwen3-MoE as transformers saves it;
    - fp8: its fine-grained FP8 release (128 x 128 block scales, Qwen3-*-FP8's layout);
    - ct fp8: llm-compressor's FP8_DYNAMIC release (compressed-tensors' float-quantized, a scale
      per channel: attention and experts), and "ct fp8 bf16 experts": its experts in bf16, its
      attention still FP8;
    - gptq, awq: 4-bit, groups of 128, attention and experts packed by AutoGPTQ (sym) and AutoAWQ
      (GEMM layout, zero points); gptq act-order: desc_act, with zero points (vLLM refuses both);
    - w4a16, w4a16 symmetric: compressed-tensors' pack-quantized INT4 experts in groups of 128,
      with and without zero points;
    - gpt-oss bf16, gpt-oss: a tiny gpt-oss saved by transformers, and its MXFP4 release as OpenAI
      ships gpt-oss (fused blocks and scales, biases, ``quant_method: mxfp4``)."""
    made: dict[str, Path] = {}

    def new(name: str) -> Path:
        made[name] = root / name.replace(" ", "-")
        made[name].mkdir()
        return made[name]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # transformers writes the two originals
        bf16, gpt_oss_bf16 = new("bf16"), new("gpt-oss bf16")
        for written in [pool.submit(drive, "model", str(bf16)), pool.submit(drive, "gpt_oss", str(gpt_oss_bf16))]:
            written.result()
    fp8_copy(bf16, new("fp8"))
    dequantized_copy(made["fp8"], new("fp8 dequantized"))
    ct_fp8_release(bf16, new("ct fp8"), new("ct fp8 bf16 experts"))
    for kind in ("gptq", "awq"):
        gptq_awq_release(bf16, new(kind), new(f"{kind} dequantized"), kind)
    gptq_awq_release(bf16, new("gptq act-order"), new("gptq act-order dequantized"), "gptq", desc_act=True)
    for name, symmetric in (("w4a16", False), ("w4a16 symmetric", True)):
        int4_release(bf16, new(name), new(f"{name} dequantized"), group=128, symmetric=symmetric)
    gpt_oss_release(gpt_oss_bf16, new("gpt-oss"))
    gpt_oss_dequantized(made["gpt-oss"], new("gpt-oss dequantized"))
    return {name: str(path) for name, path in made.items()}


def _write_and_run(root: Path) -> tuple[dict[str, str], Runs]:
    checkpoints = write_checkpoints(root)
    return checkpoints, execute(plan(), checkpoints)


def start() -> concurrent.futures.Future[tuple[dict[str, str], Runs]]:
    """The checkpoints and the runs, begun once a session (later calls return the same work)."""
    global _work, _root
    with _lock:
        if _work is None:
            _root = Path(tempfile.mkdtemp(prefix="ktforge-vllm-checkpoints-"))
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vllm-runs")
            _work = pool.submit(_write_and_run, _root)
            pool.shutdown(wait=False)
        return _work


def finish() -> None:
    """Waits for work begun and not read (a session that stopped early), then removes the
    checkpoints: no vLLM process outlives the session."""
    with _lock:
        work, root = _work, _root
    if work is not None:
        concurrent.futures.wait([work])
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
