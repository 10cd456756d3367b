"""Measures `kt convert` throughput (GB/s of input) on synthetic checkpoints of real shapes.

    python scripts/convert_throughput.py [--dir /tmp/kt-convert-bench] [--experts 32]

Writes a Qwen3-30B-A3B-shaped bf16 checkpoint (2 MoE layers, all 128 experts) and a
DeepSeek-V3-shaped FP8 one (2 MoE layers, --experts of its 256 experts, 128x128 block
scales), converts each to int8, int4 and bf16 with `kt convert`, and prints GB/s of input.
The first pass over a fresh checkpoint may read from disk; each figure is the best of two runs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file


def write(directory: Path, model_type: str, H: int, I: int, E: int, dtype: str) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    config = {"model_type": model_type, "hidden_size": H, "moe_intermediate_size": I, "num_experts_per_tok": 8}
    config |= {"num_experts": E} if model_type == "qwen3_moe" else {"n_routed_experts": E}
    if dtype == "fp8":
        config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (directory / "config.json").write_text(json.dumps(config))
    base = {shape: (rng.standard_normal(shape) * 0.02).astype(np.float32) for shape in ((I, H), (H, I))}
    weight_map: dict[str, str] = {}
    total = 0
    for layer in (1, 2):
        tensors = {}
        for e in range(E):
            for p in ("gate_proj", "up_proj", "down_proj"):
                shape = (H, I) if p == "down_proj" else (I, H)
                w = np.roll(base[shape], e, axis=1)  # distinct per expert, cheap to make
                name = f"model.layers.{layer}.mlp.experts.{e}.{p}.weight"
                if dtype == "fp8":
                    tensors[name] = (w / 0.001).astype(ml_dtypes.float8_e4m3fn)
                    tensors[name + "_scale_inv"] = np.full((shape[0] // 128, shape[1] // 128), 0.001, np.float32)
                else:
                    tensors[name] = w.astype(ml_dtypes.bfloat16)
                total += sum(t.nbytes for k, t in tensors.items() if k.startswith(name))
        shard = f"model-{layer:05d}-of-00002.safetensors"
        save_file(tensors, str(directory / shard))
        weight_map |= dict.fromkeys(tensors, shard)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kt-convert-bench"))
    parser.add_argument("--experts", type=int, default=32, help="DeepSeek-V3 experts per layer (of 256)")
    args = parser.parse_args()
    cases = [
        ("qwen3-30b-a3b bf16", "qwen3_moe", 2048, 768, 128, "bf16"),
        (f"deepseek-v3 fp8 ({args.experts} experts)", "deepseek_v3", 7168, 2048, args.experts, "fp8"),
    ]
    print(f"{'checkpoint':34} {'input GB':>8} {'quant':>5} {'GB/s':>6}")
    for label, model_type, H, I, E, dtype in cases:
        src = args.dir / model_type
        size = write(src, model_type, H, I, E, dtype)
        for quant in ("int8", "int4", "bf16"):
            best = 0.0
            for _ in range(2):
                out = args.dir / f"{model_type}-{quant}"
                shutil.rmtree(out, ignore_errors=True)
                command = ["convert", "--input", str(src), "--output", str(out), "--quant", quant]
                done = subprocess.run(
                    [sys.executable, "-c", "from ktforge.cli.commands import main; main()", *command],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                best = max(best, float(re.search(r"([0-9.]+) GB/s of input", done.stderr).group(1)))  # type: ignore[union-attr]
            print(f"{label:34} {size / 1e9:8.2f} {quant:>5} {best:6.2f}")
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
