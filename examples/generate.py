"""Generate with a Hugging Face MoE checkpoint whose routed experts run on ktforge's kernels.

    python examples/generate.py PATH [--prompt TEXT] [--max-new-tokens N] [--method bf16|int8|int8g|int4]
                                     [--converted DIR] [--eager]

PATH: a local checkpoint directory (config.json, *.safetensors, tokenizer files). Prints the
text and the prefill and decode speeds (tokens/s). --converted DIR takes the routed experts
from `kt convert --input PATH --output DIR` (its method) instead of packing PATH's; --eager
runs transformers' own experts, for comparison. Set OMP_WAIT_POLICY=PASSIVE in the environment (before Python starts) so
torch's idle threads do not spin on the cores ktforge computes on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import ktforge.checkpoints.convert
import ktforge.formats
import ktforge.transformers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path")
    parser.add_argument("--prompt", default="The fastest way to run a mixture-of-experts model on a CPU is")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--method", default="bf16", choices=list(ktforge.formats.names()))
    parser.add_argument("--converted", help="a `kt convert` output of PATH: the experts from there")
    parser.add_argument("--eager", action="store_true", help="transformers' own experts instead")
    args = parser.parse_args()
    if args.eager and args.converted:
        parser.error("--eager runs transformers' own experts; --converted loads ktforge's: choose one")

    ktforge.transformers.configure(method=args.method, release_torch_weights=not args.eager)
    implementation = "eager" if args.eager else "ktforge"
    tokenizer = AutoTokenizer.from_pretrained(args.path)
    model = AutoModelForCausalLM.from_pretrained(
        args.path, dtype=torch.bfloat16, experts_implementation=implementation
    ).eval()
    method = args.method
    if args.converted:
        layers = ktforge.transformers.load_converted(model, args.converted)
        method = ktforge.checkpoints.convert.read_manifest(Path(args.converted))["method"]
        print(f"experts of layers {layers} from {args.converted} ({method})")
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        model(ids[:, :1])  # packs the experts (ktforge) before anything is timed
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill_s = time.perf_counter() - start
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        generated = [token]
        start = time.perf_counter()
        for _ in range(args.max_new_tokens - 1):
            out = model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            generated.append(token)
        decode_s = time.perf_counter() - start
    print(tokenizer.decode(torch.cat([ids, *generated], dim=1)[0], skip_special_tokens=True))
    print(
        f"\n[{implementation}, {method}] prefill {ids.shape[1] / prefill_s:.1f} tokens/s "
        f"({ids.shape[1]} tokens), decode {(args.max_new_tokens - 1) / decode_s:.2f} tokens/s"
    )


if __name__ == "__main__":
    main()
