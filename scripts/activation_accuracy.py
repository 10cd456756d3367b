"""The accuracy of int8 activation schemes on llama.cpp's own files, at realistic activations (a
benchmark, not a test).

For each GGUF type of tests/fixtures/gguf (qwen3moe layers quantized by llama.cpp's own quantizer,
scripts/make_gguf_fixtures.py), the MoE layer's error relative to the float64 layer over gguf-py's
dequantization of the file with exact activations, for hidden states that are Gaussian, Gaussian
with 4 channels at x20 or x100 ("massive activations"), or Student-t with 3 degrees of freedom
(heavy-tailed); the down projection's input is whatever the layer makes of them. Columns:
- ktforge: MoE.from_pretrained(file) on this machine's kernels (a scale per block of K,
  formats.json's activation_block; `info["activations"]` says which);
- llama.cpp's scheme, emulated in NumPy: a scale per 32 values (Q8_0's blocks: the legacy types,
  Q8_0, IQ4_NL, MXFP4) or per 256 (Q8_K's: the K-quants, IQ4_XS);
- a scale per token (ktforge's scheme before per-block scales; kt-kernel's), emulated.
The error is the largest |difference| over the largest |exact output|, the median of --seeds inputs.

    python scripts/activation_accuracy.py                 # every type of the fixtures
    python scripts/activation_accuracy.py --types Q8_0,Q4_K --tokens 64
    python scripts/activation_accuracy.py --int8     # ktforge's own per-row int8 instead

--int8: per-row int8 (ktforge's own format, no GGUF type) at Qwen3-30B-A3B's expert shapes (2048 x
768, 16 experts, top 8; Gaussian weights, std 1/sqrt(K)), its kernels with a scale per 128 values
of K against a scale per token (MoE(activations=...)), both against the float64 layer over the
int8 weights with exact activations; the error as above, and the RMS error over the RMS output.

Caveats: the fixtures' hidden and intermediate sizes are 256 (tiny files), so a per-256 block is a
whole token's row there; at Qwen3-30B-A3B's 2048 a token's scale spans 8 times more values than
per-256 and 64 times more than per-32. scripts/llama_cpp_accuracy.py compares llama.cpp's own
layer output (its eval callback's ffn_moe_out) at those shapes.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import dequantize as gguf_dequantize

import ktforge

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "gguf"
# llama.cpp's activation blocks: Q8_K (256) for the K-quants and IQ4_XS, Q8_0 (32) for the others
LLAMA_BLOCK = {"Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ4_XS": 256}
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
INPUTS = ("gaussian", "4 channels x20", "4 channels x100", "student-t 3")


def dense(path: Path) -> list[Any]:
    """gate, up, down as gguf-py dequantizes the file's layer 0, float64."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    named = [tensors[f"blk.0.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")]
    return [gguf_dequantize(t.data, t.tensor_type).astype(np.float64) for t in named]


def taken(a: Any, block: int | None) -> Any:
    """Rows of ``a`` as int8 with a symmetric scale per ``block`` values (float32 arithmetic, as
    the kernels), dequantized; None: exact."""
    a = np.asarray(a, np.float32)
    if block is None:
        return a.astype(np.float64)
    m, k = a.shape
    kp = -(-k // block) * block
    padded = np.zeros((m, kp), np.float32)
    padded[:, :k] = a
    blocks = padded.reshape(m, kp // block, block)
    scale = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    scale = np.where(scale >= np.finfo(np.float32).tiny, scale, np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(blocks * (np.float32(1) / scale)[..., None]), -127, 127)
    return (q * scale[..., None].astype(np.float64)).reshape(m, kp)[:, :k]


def layer(x: Any, ids: Any, w: Any, weights: list[Any], block: int | None, inner_block: int | None) -> Any:
    """The layer in float64 with x and the intermediate activation as ``taken`` takes them."""
    gate, up, down = weights
    out = np.zeros((x.shape[0], down.shape[1]))
    xq = taken(x, block)
    for e in np.unique(ids):
        tokens, slots = np.nonzero(ids == e)
        g, u = xq[tokens] @ gate[e].T, xq[tokens] @ up[e].T
        a = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        out[tokens] += w[tokens, slots][:, None] * (taken(a, inner_block) @ down[e].T)
    return out


def hidden_states(kind: str, tokens: int, hidden: int, rng: np.random.Generator) -> Any:
    if kind == "student-t 3":
        return rng.standard_t(3, (tokens, hidden)).astype(np.float32)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    if kind != "gaussian":
        x[:, rng.choice(hidden, 4, replace=False)] *= np.float32(float(kind.rsplit("x", 1)[1]))
    return x


def own_int8(tokens: int, seeds: int) -> None:
    """Per-row int8 per block against per token on ktforge's kernels (the module docstring's --int8)."""
    from ktforge.formats.quantize import dequantize, quantize

    experts, top_k, hidden, inner = 16, 8, 2048, 768
    rng = np.random.default_rng(0)
    floats = [
        (rng.standard_normal((experts, n, k)) / np.sqrt(k)).astype(np.float32)
        for n, k in ((inner, hidden), (inner, hidden), (hidden, inner))
    ]
    weights = [dequantize(quantize(f, "int8"), "int8", f.shape[-1]).astype(np.float64) for f in floats]
    layers = {}
    for activations in ("per-block", "per-token"):
        layers[activations] = ktforge.MoE(experts, top_k, hidden, inner, method="int8", activations=activations)
        layers[activations].load_weights(*floats)
    columns = f"{'per block':>10} {'per token':>10} {'ratio':>6}"
    print(f"{'activations':<16} {columns}   RMS: {columns}")
    for kind in INPUTS:
        errors: dict[str, list[float]] = {f"{m} {a}": [] for m in ("max", "rms") for a in layers}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            x = hidden_states(kind, tokens, hidden, rng)
            ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
            w = rng.random((tokens, top_k)).astype(np.float32)
            exact = layer(x, ids, w, weights, None, None)
            for name, moe in layers.items():
                diff = np.asarray(moe.forward(x, ids, w), np.float64) - exact
                errors[f"max {name}"].append(float(np.abs(diff).max() / np.abs(exact).max()))
                errors[f"rms {name}"].append(float(np.sqrt((diff**2).mean() / (exact**2).mean())))
        e = {key: statistics.median(v) for key, v in errors.items()}
        pairs = [(e[m + " per-block"], e[m + " per-token"]) for m in ("max", "rms")]
        cells = [f"{block:>10.2e} {token:>10.2e} {block / token:>6.2f}" for block, token in pairs]
        print(f"{kind:<16} {cells[0]}   RMS: {cells[1]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--int8", action="store_true", help="ktforge's own per-row int8 instead (see above)")
    options = parser.parse_args()
    if options.int8:
        own_int8(options.tokens, options.seeds)
        return 0
    print(
        f"{'type':<7} {'activations':<16} {'ktforge':>9} {'llama.cpp':>10} {'per token':>10} "
        f"{'ktforge/llama.cpp':>18}  ktforge's scheme"
    )
    for name in options.types.split(","):
        path = FIXTURES / f"qwen3moe-{name}.gguf"
        weights = dense(path)
        moe = ktforge.MoE.from_pretrained(path, 0)
        experts, hidden, inner = weights[0].shape[0], weights[0].shape[2], weights[0].shape[1]
        llama = LLAMA_BLOCK.get(name, 32)
        for kind in INPUTS:
            errors: dict[str, list[float]] = {"ktforge": [], "llama.cpp": [], "per token": []}
            for seed in range(options.seeds):
                rng = np.random.default_rng(seed)
                x = hidden_states(kind, options.tokens, hidden, rng)
                ids = np.stack([rng.permutation(experts)[: moe.top_k] for _ in range(options.tokens)])
                w = rng.random((options.tokens, moe.top_k)).astype(np.float32)
                exact = layer(x, ids, w, weights, None, None)
                scale = np.abs(exact).max()
                outputs = {
                    "ktforge": np.asarray(moe.forward(x, ids, w), np.float64),
                    "llama.cpp": layer(x, ids, w, weights, llama, llama),
                    "per token": layer(x, ids, w, weights, hidden, inner),
                }
                for key, y in outputs.items():
                    errors[key].append(float(np.abs(y - exact).max() / scale))
            e = {key: statistics.median(v) for key, v in errors.items()}
            print(
                f"{name:<7} {kind:<16} {e['ktforge']:>9.2e} {e['llama.cpp']:>10.2e} {e['per token']:>10.2e} "
                f"{e['ktforge'] / e['llama.cpp']:>18.2f}  {moe.info['activations']['gate_up']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
