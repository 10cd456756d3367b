"""transformers' default experts against experts_implementation="ktforge", in one run.

A Qwen3-MoE model with the real Qwen3-30B-A3B layer shapes (hidden 2048, 128 experts of 768,
top-8, 32 query / 4 key-value heads of 128) and --layers layers, random bf16 weights (no
download); two copies of the same weights, one per implementation, timed interleaved
(A B A B): prefill of --prefill tokens, then --decode decode steps. Prints the medians and
the speed-ups.

With --experts-share a third copy runs experts that cost nothing (they return zeros), so the
experts' share of a decode step is the step minus that step: the script prints it for both
implementations, their ratio, and ktforge's share per layer against one ktforge layer of the
same shapes called alone (a decode call, 1 token). It also times each of ktforge's experts calls
inside the model (a wrapper around its experts function), which has none of the subtraction's
noise but leaves out what the calls cost the torch ops after them (threads handed over).

    OMP_WAIT_POLICY=PASSIVE python scripts/transformers_bench.py [--layers 2] [--prefill 512]
        [--decode 16] [--repeats 3] [--baseline grouped_mm|eager|batched_mm] [--experts-share]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ktforge.transformers

ZERO = "zero-cost"  # experts that return zeros: the rest of the step, for --experts-share
DECODE_CALLS: list[float] = []  # seconds of each 1-token ktforge experts call inside the model


def _zero_experts(module: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    return torch.zeros_like(hidden_states)


def _timed_ktforge(module: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    start = time.perf_counter()
    out = ktforge.transformers.experts_forward(module, hidden_states, top_k_index, top_k_weights)
    if hidden_states.shape[0] == 1:
        DECODE_CALLS.append(time.perf_counter() - start)
    return out


def _alone_ms(method: str, repeats: int = 200) -> float:
    """One ktforge layer of the model's expert shapes, 1 token: the median call in ms."""
    import numpy as np

    rng = np.random.default_rng(0)
    E, k, H, I = 128, 8, 2048, 768
    moe = ktforge.MoE(E, k, H, I, method=method, threads=torch.get_num_threads())
    moe.load_weights(*(rng.standard_normal(s, dtype=np.float32) / 32 for s in ((E, I, H), (E, I, H), (E, H, I))))
    x = rng.standard_normal((1, H), dtype=np.float32)
    w = rng.random((1, k), dtype=np.float32)
    times = []
    for _ in range(repeats):
        ids = rng.permutation(E)[:k].reshape(1, k)
        start = time.perf_counter()
        moe.forward(x, ids, w)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def model(layers: int, implementation: str) -> Any:
    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=2048,
        moe_intermediate_size=768,
        intermediate_size=6144,
        num_experts=128,
        num_experts_per_tok=8,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_hidden_layers=layers,
        vocab_size=4096,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    built.set_experts_implementation(implementation)
    return built


def run(m: Any, prompt: torch.Tensor, decode: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s)."""
    with torch.inference_mode():
        start = time.perf_counter()
        out = m(prompt, use_cache=True)
        prefill = time.perf_counter() - start
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(decode):
            out = m(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return prefill, decode / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="grouped_mm", help="transformers' implementation to compare with")
    parser.add_argument("--method", default="bf16")
    parser.add_argument("--experts-share", action="store_true", help="also time zero-cost experts (see above)")
    args = parser.parse_args()
    ktforge.transformers.configure(method=args.method, release_torch_weights=True)
    contenders = {args.baseline: model(args.layers, args.baseline), "ktforge": model(args.layers, "ktforge")}
    if args.experts_share:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(ZERO, _zero_experts)
        ALL_EXPERTS_FUNCTIONS.register(ktforge.transformers.NAME, _timed_ktforge)  # the same, timed
        contenders[ZERO] = model(args.layers, ZERO)
    prompt = torch.randint(0, 4096, (1, args.prefill), generator=torch.Generator().manual_seed(1))
    for m in contenders.values():
        run(m, prompt[:, :8], 2)  # warm-up (and ktforge packs its experts)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for r in range(args.repeats):
        for name in list(contenders) if r % 2 == 0 else list(contenders)[::-1]:
            results[name].append(run(contenders[name], prompt, args.decode))
    print(
        f"Qwen3-30B-A3B shapes, {args.layers} layers, bf16 weights, {torch.get_num_threads()} threads, "
        f"median of {args.repeats} interleaved runs; ktforge method {args.method}"
    )
    rows = {}
    for name, runs in results.items():
        prefill = statistics.median(p for p, _ in runs)
        decode = statistics.median(d for _, d in runs)
        rows[name] = (prefill, decode)
        print(
            f"  {name:12} prefill {args.prefill} tokens: {prefill:7.2f} s ({args.prefill / prefill:7.1f} tok/s)   "
            f"decode: {decode:6.2f} tok/s"
        )
    base, ours = rows[args.baseline], rows["ktforge"]
    print(f"  speed-up: prefill {base[0] / ours[0]:.2f}x, decode {ours[1] / base[1]:.2f}x")
    if args.experts_share:
        step_ms = {name: 1e3 / decode for name, (_, decode) in rows.items()}
        share = {name: step_ms[name] - step_ms[ZERO] for name in (args.baseline, "ktforge")}
        alone = _alone_ms(args.method)
        per_layer = share["ktforge"] / args.layers
        print(
            f"  experts per decode step: {args.baseline} {share[args.baseline]:.2f} ms, "
            f"ktforge {share['ktforge']:.2f} ms"
            f" ({share[args.baseline] / share['ktforge']:.2f}x); ktforge per layer {per_layer:.2f} ms vs "
            f"{alone:.2f} ms alone ({per_layer / alone:.2f}x)"
        )
        inside = statistics.median(DECODE_CALLS) * 1e3
        print(
            f"  ktforge's experts calls timed inside the model: median {inside:.2f} ms over {len(DECODE_CALLS)} "
            f"1-token calls ({inside / alone:.2f}x alone)"
        )


if __name__ == "__main__":
    main()
