"""ktforge's MoE layer beside llama.cpp's own layer output, on the same file and the same input, at
Qwen3-30B-A3B's expert shapes (a benchmark, not a test).

1. In llama-cpp-python's virtualenv (scripts/llama_cpp_compare.py's, built once, ~10-15 minutes
   on 2 cores): gguf-py writes a one-layer qwen3moe model whose experts have Qwen3-30B-A3B's shapes
   (hidden 2048, intermediate 768; --experts of them, top 8), its attention output zero (each
   token's layer input is its normalized embedding) and its token embeddings the inputs below;
   llama.cpp's own quantizer (llama_model_quantize, pure) makes one file per GGUF type, the
   embeddings kept in F32.
2. llama.cpp runs every input token through each file in one batch; its eval callback hands over
   the layer's own tensors: the experts' input (ffn_norm), the routing (ffn_moe_topk,
   ffn_moe_weights_norm) and the routed experts' output (ffn_moe_out).
3. Here: the float64 layer over gguf-py's dequantization of the same file, with llama.cpp's input
   and routing and exact activations, is the reference; ktforge serves the same file
   (MoE.from_pretrained) on that input and routing.

Inputs (--tokens each, --seeds sets): Gaussian hidden states, with 4 channels at x20 or x100
("massive activations"), and Student-t with 3 degrees of freedom (heavy-tailed); the down
projection's input is whatever the layer makes of them. The error is the largest |difference|
over the largest |exact output| of a set's tokens, the median over the sets. Columns: ktforge,
llama.cpp's actual output, their ratio, and a scale per token over the same file (emulated in
NumPy by activation_accuracy.py's layer: ktforge's scheme before per-block scales, kt-kernel's).

    python scripts/llama_cpp_accuracy.py
    python scripts/llama_cpp_accuracy.py --types Q8_0,Q4_K --experts 16 --seeds 3
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import llama_cpp_compare as compare
import numpy as np

HIDDEN, INTER = compare.HIDDEN, compare.INTER  # Qwen3-30B-A3B's routed experts
HEADS, KV_HEADS, HEAD_DIM = compare.HEADS, compare.KV_HEADS, compare.HEAD_DIM
INPUTS = ("gaussian", "4 channels x20", "4 channels x100", "student-t 3")
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
F32 = 0  # ggml_type
CAPTURED = ("ffn_norm-0", "ffn_moe_topk-0", "ffn_moe_weights_norm-0", "ffn_moe_out-0")


def inputs(tokens: int, seeds: int) -> Any:
    """Every (input, seed) set's tokens, in that order: the model's token embeddings."""
    from activation_accuracy import hidden_states

    sets = [(kind, np.random.default_rng(1000 * s + i)) for i, kind in enumerate(INPUTS) for s in range(seeds)]
    return np.concatenate([hidden_states(kind, tokens, HIDDEN, rng) for kind, rng in sets])


# ---- llama.cpp's side (runs in its virtualenv) ---------------------------------------------


def write_source(path: Path, experts: int, embeddings: Any) -> None:
    """The float32 model every type is quantized from."""
    writer = compare.qwen3moe_writer(path, 1, INTER, experts, len(embeddings), "f32")
    rng = np.random.default_rng(7)

    def normal(*shape: int, scale: float) -> Any:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    writer.add_tensor("token_embd.weight", np.ascontiguousarray(embeddings, np.float32))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.add_tensor("output.weight", normal(len(embeddings), HIDDEN, scale=0.02))
    b = "blk.0."
    for name, shape in (("attn_q", (HEADS * HEAD_DIM, HIDDEN)), ("attn_k", (KV_HEADS * HEAD_DIM, HIDDEN))):
        writer.add_tensor(b + name + ".weight", normal(*shape, scale=0.02))
    writer.add_tensor(b + "attn_v.weight", normal(KV_HEADS * HEAD_DIM, HIDDEN, scale=0.02))
    # zero: the layer's input is each token's own normalized embedding
    writer.add_tensor(b + "attn_output.weight", np.zeros((HIDDEN, HEADS * HEAD_DIM), np.float32))
    for name, size in (
        ("attn_norm", HIDDEN),
        ("attn_q_norm", HEAD_DIM),
        ("attn_k_norm", HEAD_DIM),
        ("ffn_norm", HIDDEN),
    ):
        writer.add_tensor(b + name + ".weight", np.ones(size, np.float32))
    writer.add_tensor(b + "ffn_gate_inp.weight", normal(experts, HIDDEN, scale=0.05))
    for name, rows, fan_in in (
        ("ffn_gate_exps", INTER, HIDDEN),
        ("ffn_up_exps", INTER, HIDDEN),
        ("ffn_down_exps", HIDDEN, INTER),
    ):
        # numpy's [E, N, K]
        writer.add_tensor(b + name + ".weight", normal(experts, rows, fan_in, scale=1 / np.sqrt(fan_in)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (ggml 0.9 in llama-cpp-python 0.3.36), as far as name."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def tensor_array(t: GgmlTensor) -> Any:
    """A copy of a float32 or int32 tensor's values, numpy's order (ggml's ne reversed)."""
    dtype = {0: np.float32, 26: np.int32}[t.type]  # GGML_TYPE_F32, GGML_TYPE_I32
    ne, nb = list(t.ne), list(t.nb)
    span = sum((n - 1) * s for n, s in zip(ne, nb, strict=True)) + np.dtype(dtype).itemsize
    raw = np.frombuffer((ctypes.c_char * span).from_address(t.data), np.uint8)
    view = np.lib.stride_tricks.as_strided(raw.view(dtype)[:1], shape=ne[::-1], strides=nb[::-1])
    return np.array(view).squeeze()


def run_llama(model: Path, count: int, out: Path) -> None:
    """Every token id once, in one batch; the layer's tensors saved to ``out`` (npz)."""
    import llama_cpp

    captured: dict[str, Any] = {}

    def callback(pointer: int, ask: bool, _: int) -> bool:
        t = GgmlTensor.from_address(pointer)
        name = t.name.decode()
        if ask:
            return name in CAPTURED
        if name in CAPTURED:
            captured[name] = tensor_array(t)
        return True

    keep = llama_cpp.ggml_backend_sched_eval_callback(callback)
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(str(model).encode(), llama_cpp.llama_model_default_params())
    if not loaded:
        raise SystemExit(f"llama.cpp could not load {model}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = count
    params.n_threads = params.n_threads_batch = os.cpu_count() or 1
    params.cb_eval = keep
    ctx = llama_cpp.llama_init_from_model(loaded, params)
    batch = llama_cpp.llama_batch_init(count, 0, 1)
    batch.n_tokens = count
    for i in range(count):  # every token's output wanted: else the layer runs on the last one only
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = i, i, 1, 1
        batch.seq_id[i][0] = 0
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise SystemExit("llama_decode failed")
    llama_cpp.llama_synchronize(ctx)
    missing = set(CAPTURED) - set(captured)
    if missing:
        raise SystemExit(f"llama.cpp's graph had no tensor named {sorted(missing)}")
    np.savez(out, **{name.split("-")[0]: value for name, value in captured.items()})


def worker(args: list[str]) -> None:
    if args[0] == "build":
        work, experts = Path(args[1]), int(args[2])
        source = work / "source-f32.gguf"
        if not source.is_file():
            write_source(source, experts, np.load(work / "inputs.npy"))
        for name in args[3].split(","):
            target = work / f"model-{name}.gguf"
            if not target.is_file():
                compare.quantize_gguf(source, target, name.lower(), embeddings=F32)  # the inputs as written
    else:
        run_llama(Path(args[1]), int(args[2]), Path(args[3]))


# ---- the comparison (runs with ktforge) ----------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--experts", type=int, default=16, help="experts in the layer (Qwen3-30B-A3B: 128)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens a set")
    parser.add_argument("--seeds", type=int, default=3, help="sets an input")
    parser.add_argument("--work", default=str(compare.CACHE / "llama-cpp-accuracy"))
    parser.add_argument("--venv", default=str(compare.CACHE / "llama-cpp-noamx"), help="llama-cpp-python's virtualenv")
    options = parser.parse_args()
    import activation_accuracy as schemes  # imports ktforge: not in llama.cpp's virtualenv

    import ktforge

    work = Path(options.work) / f"v2-e{options.experts}-t{options.tokens}-s{options.seeds}"
    work.mkdir(parents=True, exist_ok=True)
    python = compare.ensure_venv(Path(options.venv))
    names = options.types.split(",")
    me = [str(python), __file__, "--worker"]
    print(f"==> writing and quantizing the models in {work} (gguf-py, llama_model_quantize)", flush=True)
    if not (work / "inputs.npy").is_file():
        np.save(work / "inputs.npy", inputs(options.tokens, options.seeds))
    with (work / "llama.log").open("a") as log:
        command = [*me, "build", str(work), str(options.experts), ",".join(names)]
        subprocess.run(command, check=True, stdout=log, stderr=log)
    count = len(INPUTS) * options.seeds * options.tokens
    print(
        f"{'':<24} {'largest |difference| / largest |exact|':^50} {'RMS difference / RMS exact':^40}\n"
        f"{'type':<7} {'activations':<16} {'ktforge':>9} {'llama.cpp':>10} {'ratio':>6} {'per token':>10}"
        f"{'':>13} {'ktforge':>9} {'llama.cpp':>10} {'ratio':>6} {'per token':>10}  ktforge's scheme"
    )
    for name in names:
        model, tensors = work / f"model-{name}.gguf", work / f"llama-{name}.npz"
        with (work / "llama.log").open("a") as log:
            subprocess.run([*me, "run", str(model), str(count), str(tensors)], check=True, stderr=log)
        llama = np.load(tensors)
        weights = schemes.dense(model)
        moe = ktforge.MoE.from_pretrained(model, 0)
        x, ids, w = llama["ffn_norm"], llama["ffn_moe_topk"], llama["ffn_moe_weights_norm"]
        for i, kind in enumerate(INPUTS):
            errors: dict[str, list[float]] = {"ktforge": [], "llama.cpp": [], "per token": []}
            rms: dict[str, list[float]] = {"ktforge": [], "llama.cpp": [], "per token": []}
            for s in range(options.seeds):
                rows = slice((i * options.seeds + s) * options.tokens, (i * options.seeds + s + 1) * options.tokens)
                exact = schemes.layer(x[rows], ids[rows], w[rows], weights, None, None)
                outputs = {
                    "ktforge": np.asarray(moe.forward(x[rows], ids[rows], w[rows]), np.float64),
                    "llama.cpp": llama["ffn_moe_out"][rows],
                    "per token": schemes.layer(x[rows], ids[rows], w[rows], weights, HIDDEN, INTER),
                }
                for key, y in outputs.items():
                    errors[key].append(float(np.abs(y - exact).max() / np.abs(exact).max()))
                    rms[key].append(float(np.sqrt(np.mean((y - exact) ** 2) / np.mean(exact**2))))
            columns = []
            for measure in (errors, rms):
                e = {key: statistics.median(v) for key, v in measure.items()}
                ratio = e["ktforge"] / e["llama.cpp"]
                columns.append(f"{e['ktforge']:>9.2e} {e['llama.cpp']:>10.2e} {ratio:>6.2f} {e['per token']:>10.2e}")
            print(
                f"{name:<7} {kind:<16} {columns[0]}{'':>13} {columns[1]}  {moe.info['activations']['gate_up']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
