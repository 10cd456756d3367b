"""vLLM's CPU backend with ktforge's experts beside its own, in one run, alternating.

A Qwen3-30B-A3B-shaped model (its layer shapes: hidden 2048, 128 experts of 768, top-8, 32 heads
of 128 over 4 KV heads; ``--layers`` of them, random weights, a 32k vocabulary) in bf16, and its
fine-grained FP8 release (128 x 128 block scales, as the Qwen3-*-FP8 releases), served by vLLM's
offline API in one process a configuration:

- vLLM's own bf16 MoE, and its own FP8 MoE on the FP8 release (vLLM runs it only with AMX);
- ktforge bf16 (no flag), the FP8 release as it is, and ktforge's int8, int4 and mxfp4 from the
  bf16 checkpoint (``--quantization ktforge``).

Each round starts every configuration once, in turn; a configuration's figures are the median and
range over rounds. Decode: tokens/s at batch 1 and 8 (64 new tokens each); prefill: 512-token
prompts, tokens/s; each with the MoE layers' share of the time (routing and experts, timed around
vLLM's MoE runner); memory: the resident set after loading. ``--busy`` runs every measurement
beside one niced busy process a core (a shared machine: vLLM's and torch's threads contend).

    python3 scripts/vllm_bench.py [--layers 2] [--rounds 2] [--configs A,B] [--busy]

It builds vLLM's environment as the tests do (build/vllm-env, ktforge's wheel from ./install.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def online(method: str, group: int) -> dict[str, Any]:
    """ktforge's online ``method`` from the bf16 checkpoint, through vLLM's own arguments."""
    override = {"quantization_config": {"quant_method": "ktforge", "method": method, "group_size": group}}
    return {"env": {}, "kwargs": {"quantization": "ktforge", "hf_overrides": override}}


CONFIGS: dict[str, dict[str, Any]] = {
    "vLLM bf16": {"env": {"KTFORGE_VLLM": "0"}, "kwargs": {}},
    "ktforge bf16": {"env": {}, "kwargs": {}},
    "ktforge int8": {"env": {}, "kwargs": {"quantization": "ktforge"}},  # per-row int8, the default
    "ktforge int4": online("int4", 128),
    "ktforge mxfp4": online("mxfp4", 32),
    "vLLM fp8 release": {"env": {"KTFORGE_VLLM": "0"}, "kwargs": {}, "checkpoint": "fp8"},
    "ktforge fp8 release": {"env": {}, "kwargs": {}, "checkpoint": "fp8"},
}


def make_model(directory: str, layers: int) -> None:  # runs in vLLM's environment
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ktforge.resources import data_path, load_toml

    experts = load_toml(data_path("bench_models.toml"))["qwen3-30b-a3b"]  # kt bench's catalogue
    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=experts["hidden"],
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=32000,
        moe_intermediate_size=experts["intermediate"],
        intermediate_size=6144,
        num_experts=experts["experts"],
        num_experts_per_tok=experts["top_k"],
        norm_topk_prob=True,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    model.save_pretrained(directory)


def measure(directory: str, kwargs: str) -> None:  # runs in vLLM's environment, the engine in this process
    import time

    import psutil  # type: ignore[import-untyped]
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    spent = [0.0]  # in the MoE layers: vLLM's runner, routing and experts, whoever computes them
    run_layer = MoERunner._forward_impl

    def timed_layer(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return run_layer(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    MoERunner._forward_impl = timed_layer  # the moe_forward op (compiled or not) looks it up per call
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    llm = LLM(
        model=directory,
        skip_tokenizer_init=True,
        max_model_len=1024,
        max_num_seqs=8,
        enable_prefix_caching=False,  # every timed call computes its prompt again
        distributed_executor_backend="uni",  # the model in this process, where the runner is timed
        **json.loads(kwargs),
    )
    me = psutil.Process()
    rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])

    def timed(batch: int, prompt: int, new: int) -> tuple[float, float]:
        """The median time of a generate call, and the time its MoE layers took in that call."""
        prompts = [{"prompt_token_ids": [(7 * i + j) % 31000 + 10 for j in range(prompt)]} for i in range(batch)]
        params = SamplingParams(max_tokens=new, ignore_eos=True, temperature=0, detokenize=False)
        llm.generate(prompts, params, use_tqdm=False)  # warm
        runs = []
        for _ in range(3):
            spent[0] = 0.0
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            runs.append((time.perf_counter() - start, spent[0]))
        return sorted(runs)[1]

    figures = {}
    for name, batch in (("decode1", 1), ("decode8", 8)):
        (whole, moe), (prompt_only, prompt_moe) = timed(batch, 16, 65), timed(batch, 16, 1)
        figures[name] = batch * 64 / (whole - prompt_only)  # new tokens' time, less the prompt's
        figures[name + "_moe"] = (moe - prompt_moe) / (whole - prompt_only)
    whole, moe = timed(1, 512, 1)
    figures |= {"prefill512": 512 / whole, "prefill512_moe": moe / whole, "rss_gib": rss / 2**30}
    print("RESULT " + json.dumps(figures))


def busy_cores() -> list[subprocess.Popen[bytes]]:
    """One niced busy process a core this process may use."""
    spin = "while True: pass"
    return [subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", spin]) for _ in os.sched_getaffinity(0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--busy", action="store_true", help="beside one niced busy process a core")
    args = parser.parse_args()
    from tests.engines.vllm.environment import python
    from tests.fp8_checkpoints import fp8_copy

    py = str(python())
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.configs.split(",")}
    unknown = sorted(set(results) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = {"bf16": Path(tmp) / "bf16", "fp8": Path(tmp) / "fp8"}
        subprocess.run([py, __file__, "_model", str(checkpoints["bf16"]), str(args.layers)], check=True)
        if any(CONFIGS[name].get("checkpoint") == "fp8" for name in results):
            fp8_copy(checkpoints["bf16"], checkpoints["fp8"])
        sizes = {k: sum(p.stat().st_size for p in d.glob("*.safetensors")) / 2**30 for k, d in checkpoints.items()}
        busy = busy_cores() if args.busy else []
        try:
            for round_ in range(args.rounds):
                for name in results:
                    results[name].append(run(py, name, checkpoints[CONFIGS[name].get("checkpoint", "bf16")]))
                    print(f"round {round_ + 1} {name}: {results[name][-1]}", flush=True)
        finally:
            for process in busy:
                process.kill()
    report(results, sizes, args)


def run(py: str, name: str, checkpoint: Path) -> dict[str, float]:
    """One configuration's figures, from a process of its own."""
    config = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KTFORGE_", "VLLM_"))}
    env |= {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **config["env"]}
    if name.startswith("vLLM"):
        env["PYTHONPATH"] = str(ROOT / "tests/engines/vllm/amx_permission")
    done = subprocess.run(
        [py, __file__, "_measure", str(checkpoint), json.dumps(config["kwargs"])],
        capture_output=True,
        text=True,
        env=env,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        raise SystemExit(f"{name} failed:\n{done.stderr[-4000:]}")
    figures: dict[str, float] = json.loads(line[-1].removeprefix("RESULT "))
    return figures


def report(results: dict[str, list[dict[str, float]]], sizes: dict[str, float], args: argparse.Namespace) -> None:
    sizes_text = ", ".join(f"{k} {v:.2f} GiB" for k, v in sizes.items() if v)
    where = "beside one niced busy process a core" if args.busy else "quiet"
    print(f"\ncheckpoints {sizes_text}; {where}; median (min-max) of {args.rounds} rounds; MoE: the MoE layers' share")
    print(
        "| configuration | decode b=1 tok/s | MoE | decode b=8 tok/s | MoE | prefill 512 tok/s | MoE | RSS GiB "
        "| b=1 vs vLLM bf16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = results.get("vLLM bf16", results[next(iter(results))])
    base = statistics.median(r["decode1"] for r in first)
    for name, runs in results.items():
        cells = []
        for key in ("decode1", "decode8", "prefill512", "rss_gib"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
            if key + "_moe" in runs[0]:
                cells.append(f"{statistics.median(r[key + '_moe'] for r in runs):.0%}")
        ratio = statistics.median(r["decode1"] for r in runs) / base
        print(f"| {name} | {' | '.join(cells)} | {ratio:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_model":
        make_model(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_measure":
        measure(sys.argv[2], sys.argv[3])
    else:
        main()
