"""ktforge's experts beside llama.cpp's on the same weights, in one run (a benchmark, not a test).

llama.cpp is what CPU users run instead of ktforge. This script:
1. installs llama-cpp-python from PyPI into a virtualenv of its own, built for this CPU
   (GGML_NATIVE=ON; about 15 minutes on 2 cores, done once; --venv says where). Without its
   AMX code: 0.3.36's AMX path for Q4_0/Q8_0 dies of SIGILL (tilezero on an unconfigured tile,
   in ggml_backend_amx_mul_mat at one token) on our Emerald Rapids (AMX) guest; its AVX-512 code,
   weight repacking included, is what runs;
2. writes the weights of a few Qwen3-30B-A3B-shaped MoE layers once (bf16, seeded), makes a
   GGUF model of them with llama.cpp's own gguf-py (architecture qwen3moe) and quantizes it
   with llama.cpp's own quantizer (llama_model_quantize) to each format compared; a second
   GGUF, the same model with experts 16 wide, gives llama.cpp's time without its experts;
3. times, in alternating rounds, llama.cpp's whole model, the same with width-16 experts, and
   ktforge's layers on the same weights (ktforge quantizes them itself to the method named; or,
   for the method "gguf", serves llama.cpp's own quantized file: MoE.from_pretrained(gguf,
   layer)), each in a process of its own with the same thread count, and prints medians, ranges
   and ratios.

llama.cpp's experts per layer = (model - model with width-16 experts) / layers: what is left
is attention, norms, the router and the lm head, which the width-16 model runs too. Decode
(T <= 16 tokens) appends to a 16-token context; prefill starts from an empty one. ktforge
runs its layers back to back with a fresh uniform routing each call (llama.cpp routes by its
random router). Each side's weight error against the bf16 weights is printed (llama.cpp's
from gguf-py's own dequantization of the quantized file).

    python scripts/llama_cpp_compare.py --pairs bf16:bf16,q8_0:int8g,q8_0:int8,q4_0:int4 --tokens 1,4,512 --rounds 5
    python scripts/llama_cpp_compare.py --pairs q4_k:gguf,q8_0:gguf,q4_0:gguf,bf16:gguf
    python scripts/llama_cpp_compare.py --pairs iq2_xxs:gguf,iq2_xs:gguf,iq3_xxs:gguf,iq1_s:gguf --layers 1

The i-quants' files are written by ktforge's quantizer (llama.cpp's needs an importance matrix
that its Python binding cannot pass), NVFP4's as ModelOpt quantizes and llama.cpp's converter
packs (llama.cpp's quantizer has no NVFP4): both sides then run the same file.

    python scripts/llama_cpp_compare.py --pairs nvfp4:gguf,mxfp4:gguf --layers 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768  # Qwen3-30B-A3B's routed experts
HEADS, KV_HEADS, HEAD_DIM, VOCAB, NARROW = 32, 4, 128, 1024, 16
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
GGUF_PY = "gguf==0.19.0"
# llama.cpp's formats (llama_ftype values), each pure: every weight in the type itself, none
# promoted to another as the _S/_M mixes do
LLAMA_FTYPES = {
    "bf16": 32,
    "f32": 0,
    "f16": 1,
    "q8_0": 7,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 8,
    "q5_1": 9,
    "q4_k": 14,
    "q5_k": 16,
    "q6_k": 18,
    "q3_k": 11,
    "q2_k": 10,
    "iq4_nl": 25,
    "iq4_xs": 30,
    "mxfp4": 38,  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    "iq2_xxs": 19,
    "iq2_xs": 20,
    "iq3_xxs": 23,
    "iq1_s": 24,
    "nvfp4": 39,  # LLAMA_FTYPE_MOSTLY_NVFP4: llama.cpp converts ModelOpt checkpoints to it, its quantizer cannot
}
# llama.cpp's quantizer takes these only with an importance matrix, which llama_model_quantize
# cannot be handed from Python: their files are written here, every weight whose rows are whole
# blocks of 256 in the type by ktforge's quantizer (blocks gguf-py reads as llama.cpp defines them:
# tests/kernels/test_lattice.py), the rest as the bf16 source has them
LATTICE = {"iq2_xxs": "IQ2_XXS", "iq2_xs": "IQ2_XS", "iq3_xxs": "IQ3_XXS", "iq1_s": "IQ1_S"}
DECODE_CONTEXT = 16
MODEL_VERSION = 3  # of the GGUF models written (2: attention output zero; 3: pure); in their file names
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ktforge"


# ---- the weights ---------------------------------------------------------------------------


def _weights_dir(work: Path, layers: int) -> Path:
    return work / f"weights-{layers}l"


def write_weights(work: Path, layers: int) -> Path:
    """Layers' experts as bf16 bits (uint16 .npy), seeded: written once, read by both sides."""
    import ml_dtypes

    out = _weights_dir(work, layers)
    if (out / "done").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for layer in range(layers):
        for name, shape, fan_in in (
            ("gate", (EXPERTS, INTER, HIDDEN), HIDDEN),
            ("up", (EXPERTS, INTER, HIDDEN), HIDDEN),
            ("down", (EXPERTS, HIDDEN, INTER), INTER),
        ):
            w = np.empty(shape, np.uint16)
            for e in range(EXPERTS):  # an expert at a time: the float32 layer is never whole
                values = rng.standard_normal(shape[1:], dtype=np.float32) / np.float32(np.sqrt(fan_in))
                w[e] = values.astype(ml_dtypes.bfloat16).view(np.uint16)
            np.save(out / f"{layer}.{name}.npy", w)
    (out / "done").write_text("")
    return out


def load_layer(weights: Path, layer: int) -> tuple[Any, Any, Any]:
    gate, up, down = (np.load(weights / f"{layer}.{p}.npy", mmap_mode="r") for p in ("gate", "up", "down"))
    return gate, up, down


# ---- llama.cpp's side (runs in its virtualenv) ---------------------------------------------


def qwen3moe_writer(path: Path, layers: int, inter: int, experts: int, vocab: int, file_type: str) -> Any:
    """gguf-py's writer of a qwen3moe GGUF at Qwen3-30B-A3B's hidden size and attention, its
    hyperparameters written."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(6144)
    writer.add_expert_feed_forward_length(inter)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(TOP_K)
    writer.add_tokenizer_model("none")  # token ids go in directly: no vocabulary needed
    writer.add_vocab_size(vocab)
    writer.add_file_type(LLAMA_FTYPES[file_type])
    return writer


def write_gguf(weights: Path, layers: int, path: Path, narrow: bool) -> None:
    """A qwen3moe GGUF of these experts (or of 16-wide ones) with small random attention."""
    import gguf

    writer = qwen3moe_writer(path, layers, NARROW if narrow else INTER, EXPERTS, VOCAB, "bf16")
    rng = np.random.default_rng(1)

    def f32(*shape: int, scale: float = 0.02) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)

    bf16 = gguf.GGMLQuantizationType.BF16
    writer.add_tensor("token_embd.weight", f32(VOCAB, HIDDEN, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.add_tensor("output.weight", f32(VOCAB, HIDDEN))
    for layer in range(layers):
        b = f"blk.{layer}."
        writer.add_tensor(b + "attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(b + "attn_q.weight", f32(HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(b + "attn_k.weight", f32(KV_HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(b + "attn_v.weight", f32(KV_HEADS * HEAD_DIM, HIDDEN))
        # Zero: the attention still runs (its cost is in both models and cancels) but adds
        # nothing to the residual, so each token's experts depend on that token alone, as in
        # ktforge's uniform routing (an average over the context, the same for every new token,
        # could only make them pick the same experts). Checked with llama.cpp's own top-k
        # (an eval callback on ffn_moe_topk): 28-31 distinct experts at 4 tokens, uniform's 29.
        writer.add_tensor(b + "attn_output.weight", np.zeros((HIDDEN, HEADS * HEAD_DIM), np.float32))
        writer.add_tensor(b + "attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
        writer.add_tensor(b + "attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
        writer.add_tensor(b + "ffn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(b + "ffn_gate_inp.weight", f32(EXPERTS, HIDDEN, scale=1.0))
        gate, up, down = load_layer(weights, layer)
        if narrow:
            gate, up, down = gate[:, :NARROW], up[:, :NARROW], down[:, :, :NARROW]
        for name, w in (("ffn_gate_exps", gate), ("ffn_up_exps", up), ("ffn_down_exps", down)):
            # numpy's [E, N, K] is ggml's {K, N, E}, the layout llama.cpp's experts take
            writer.add_tensor(b + name + ".weight", np.ascontiguousarray(w).view(np.uint8), raw_dtype=bf16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize_gguf(source: Path, target: Path, quant: str, embeddings: int | None = None) -> None:
    """llama.cpp's quantizer, pure; ``embeddings``: the token embeddings' ggml type, else ``quant``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[quant]
    params.pure = True
    if embeddings is not None:
        params.token_embedding_type = embeddings
    params.nthread = os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed for {target}")


def write_lattice_gguf(source: Path, target: Path, quant: str) -> None:
    """``source`` (a bf16 GGUF) with its weights of whole 256-value rows in ``quant``, by ktforge's
    quantizer (this process's ktforge), an expert at a time on every core."""
    from concurrent.futures import ThreadPoolExecutor

    import gguf

    from ktforge.formats.quantize import quantize

    kind = gguf.GGMLQuantizationType[LATTICE[quant]]
    group = 16 if quant == "iq2_xs" else 32
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), "qwen3moe")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = LLAMA_FTYPES[quant] if field.name == "general.file_type" else field.contents()
        kinds = field.types
        writer.add_key_value(field.name, value, kinds[0], sub_type=kinds[-1] if len(kinds) > 1 else None)

    def blocks(matrix: Any) -> Any:  # bf16 bits [N, K] -> the type's blocks [N, K / 256 * bytes]
        q = quantize(_bf16_floats(matrix), quant, group)
        assert q.scale is not None  # the blocks' d
        rows, supers = q.scale.shape
        d = np.ascontiguousarray(q.scale).view(np.uint8).reshape(rows, supers, 2)
        return np.concatenate([d, q.weight.reshape(rows, supers, -1)], axis=-1).reshape(rows, -1)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for t in reader.tensors:
            data = np.asarray(t.data)
            shape = tuple(reversed(t.shape.tolist()))
            if t.tensor_type != gguf.GGMLQuantizationType.BF16 or len(shape) < 2 or shape[-1] % 256:
                writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
                continue
            bits = data.view(np.uint16).reshape(-1, *shape[-2:])
            packed = np.stack(list(pool.map(blocks, bits))).reshape(*shape[:-1], -1)
            writer.add_tensor(t.name, packed, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def nvfp4_blocks(w: Any) -> tuple[Any, float]:
    """One matrix [N, K] (float32) as ModelOpt quantizes a tensor (global = max|w| / (6 * 448), per 16
    values the float8_e4m3fn of max|w| / 6 / global, E2M1 codes), packed as llama.cpp's converter packs
    it ([4 scale bytes, then per 16 values 8 bytes: j low, j + 8 high] per 64): the blocks and the
    global scale (the ``.scale`` tensor's value for the expert)."""
    import ml_dtypes

    glob = float(np.abs(w).max()) / (6 * 448) or 1.0
    groups = w.reshape(w.shape[0], -1, 16)
    scale = (np.abs(groups).max(axis=-1) / 6 / glob).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    step = scale.astype(np.float32)[..., None] * np.float32(glob)
    values = np.divide(groups, step, out=np.zeros_like(groups), where=step > 0)
    codes = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F  # [N, G, 16]
    qs = (codes[..., :8] | (codes[..., 8:] << 4)).reshape(w.shape[0], -1, 32)
    d = scale.view(np.uint8).reshape(w.shape[0], -1, 4)
    return np.concatenate([d, qs], axis=-1).reshape(w.shape[0], -1), glob


def write_nvfp4_gguf(source: Path, target: Path) -> None:
    """``source`` (a bf16 GGUF) with its expert tensors in NVFP4 (``nvfp4_blocks``, an expert at a time)
    and each one's global scale in the ``.scale`` tensor beside it, as llama.cpp's converter writes a
    ModelOpt checkpoint; the rest (and the narrow model's down, 16 wide) as the source has them."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), "qwen3moe")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = LLAMA_FTYPES["nvfp4"] if field.name == "general.file_type" else field.contents()
        kinds = field.types
        writer.add_key_value(field.name, value, kinds[0], sub_type=kinds[-1] if len(kinds) > 1 else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        shape = tuple(reversed(t.shape.tolist()))
        if "_exps.weight" not in t.name or shape[-1] % 64:  # NVFP4 rows are whole blocks of 64
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
            continue
        experts = [nvfp4_blocks(_bf16_floats(m)) for m in data.view(np.uint16).reshape(shape)]
        writer.add_tensor(t.name, np.stack([b for b, _ in experts]), raw_dtype=gguf.GGMLQuantizationType.NVFP4)
        writer.add_tensor(t.name.replace(".weight", ".scale"), np.array([g for _, g in experts], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_weight_error(model: Path, weights: Path) -> float:
    """Relative RMS error of expert 0's gate rows in the file, dequantized by gguf-py (times the
    expert's ``.scale``, NVFP4's tensor scale, where the file has one)."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    tensors = {t.name: t for t in reader.tensors}
    tensor = tensors["blk.0.ffn_gate_exps.weight"]
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # [E, I, H]
    if "blk.0.ffn_gate_exps.scale" in tensors:
        values = values * np.asarray(tensors["blk.0.ffn_gate_exps.scale"].data)[:, None, None]
    truth = _bf16_floats(load_layer(weights, 0)[0][0])
    return _rel_rms(values[0], truth[: values.shape[1]])  # the 16-wide model holds the first rows


def _bf16_floats(bits: Any) -> Any:
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def _rel_rms(a: Any, b: Any) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2) / np.mean(np.asarray(b, np.float64) ** 2)))


class LlamaModel:
    """One GGUF loaded for timing through llama.cpp's C API (via llama-cpp-python's bindings)."""

    def __init__(self, path: Path, threads: int, max_tokens: int) -> None:
        import ctypes

        import llama_cpp

        self.api, self.ctypes = llama_cpp, ctypes
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = max_tokens + 512
        params.n_batch = params.n_ubatch = max(max_tokens, DECODE_CONTEXT)
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)
        self.rng = np.random.default_rng(2)
        self.position = 0

    def _decode(self, count: int) -> None:
        # Every token's logits asked for: llama.cpp computes its last layer only for the tokens
        # whose output is wanted (llama_batch_get_one's batch wants the last one), so that layer's
        # experts would run on 1 token whatever the count. The lm head this adds (vocabulary
        # 1024) is in the narrow model too and cancels.
        batch = self.batch
        batch.n_tokens = count
        for i, token in enumerate(self.rng.integers(0, VOCAB, count).tolist()):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, self.position + i, 1, 1
            batch.seq_id[i][0] = 0
        if self.api.llama_decode(self.ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        self.api.llama_synchronize(self.ctx)
        self.position += count

    def _clear(self) -> None:
        self.api.llama_memory_clear(self.api.llama_get_memory(self.ctx), True)
        self.position = 0

    def time_calls(self, tokens: int, calls: int) -> list[float]:
        times = []
        decode = tokens <= DECODE_CONTEXT
        for _ in range(calls + 1):  # the first is a lead-in
            if not decode or self.position == 0 or self.position + tokens > 512:
                self._clear()
                if decode:
                    self._decode(DECODE_CONTEXT)
            start = time.perf_counter()
            self._decode(tokens)
            times.append((time.perf_counter() - start) * 1e3)
        return times[1:]


# ---- ktforge's side ------------------------------------------------------------------------


class KtforgeLayers:
    def __init__(self, weights: Path, layers: int, method: str, threads: int, gguf: Path | None = None) -> None:
        import ktforge

        self.layers = []
        for layer in range(layers):
            if gguf is not None:  # llama.cpp's own file, served in its values
                self.layers.append(ktforge.MoE.from_pretrained(gguf, layer, threads=threads))
                continue
            moe = ktforge.MoE(EXPERTS, TOP_K, HIDDEN, INTER, method=method, threads=threads, group_size=32)
            gate, up, down = (np.ascontiguousarray(w) for w in load_layer(weights, layer))
            moe.load_weights(*(w.view(_bf16()) for w in (gate, up, down)))
            self.layers.append(moe)
        self.method, self.weights, self.gguf = method, weights, gguf
        self.rng = np.random.default_rng(3)

    def accuracy(self) -> dict[str, float]:
        """Layer 0 at 4 tokens against the float64 layer, and the weights' error, as llama's."""
        from ktforge.formats.quantize import dequantize, quantize

        gate, up, down = (_bf16_floats(w).astype(np.float64) for w in load_layer(self.weights, 0))
        x = self.rng.standard_normal((4, HIDDEN)).astype(np.float32)
        ids = np.stack([self.rng.permutation(EXPERTS)[:TOP_K] for _ in range(4)])
        routing = self.rng.random((4, TOP_K)).astype(np.float32)
        y = self.layers[0].forward(x, ids, routing)
        ref = np.zeros((4, HIDDEN))
        for t in range(4):
            for j, e in enumerate(ids[t]):
                g, u = gate[e] @ x[t], up[e] @ x[t]
                ref[t] += routing[t, j] * (down[e] @ (g / (1 + np.exp(-g)) * u))
        w = _bf16_floats(load_layer(self.weights, 0)[0][0])
        if self.gguf is not None:
            return {
                "layer_rel_err": layer_error_of(y, ref),
                "weight_rel_rms": llama_weight_error(self.gguf, self.weights),
            }
        rounded = w if self.method == "bf16" else dequantize(quantize(w, self.method, 32), self.method, HIDDEN)
        return {"layer_rel_err": layer_error_of(y, ref), "weight_rel_rms": _rel_rms(rounded, w)}

    def time_calls(self, tokens: int, calls: int) -> list[float]:
        times = []
        x = self.rng.standard_normal((tokens, HIDDEN)).astype(np.float32)
        weights = self.rng.random((tokens, TOP_K)).astype(np.float32)
        for _ in range(calls + 1):
            ids = np.stack([self.rng.permutation(EXPERTS)[:TOP_K] for _ in range(tokens)])
            start = time.perf_counter()
            for moe in self.layers:  # back to back, as a model calls them
                x = x + moe.forward(x, ids, weights) * np.float32(0.1)
            times.append((time.perf_counter() - start) * 1e3 / len(self.layers))
            x /= np.abs(x).max() + 1.0
        return times[1:]


def layer_error_of(y: Any, ref: Any) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def _bf16() -> Any:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# ---- workers and the driver ----------------------------------------------------------------


def serve(timer: Any, extra: dict[str, Any], out: TextIO) -> None:
    """Reads 'tokens calls' lines, answers each with a JSON list of call times (ms)."""
    out.write(json.dumps({"ready": True, **extra}) + "\n")
    out.flush()
    for line in sys.stdin:
        tokens, calls = map(int, line.split())
        out.write(json.dumps(timer.time_calls(tokens, calls)) + "\n")
        out.flush()


class Worker:
    def __init__(self, command: list[str], log: Path) -> None:
        with log.open("a") as stderr:  # llama.cpp's load messages
            pipe = subprocess.PIPE
            self.process = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=stderr, text=True)
        self.hello = self._read()

    def _read(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"worker {' '.join(self.process.args)} exited ({self.process.wait()}); see its log")  # type: ignore[arg-type]
        return json.loads(line)

    def time_calls(self, tokens: int, calls: int) -> list[float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{tokens} {calls}\n")
        self.process.stdin.flush()
        return list(self._read())

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait()


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import llama_cpp, gguf"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"==> installing {LLAMA_CPP_PYTHON} (built for this CPU: ~15 min on 2 cores) into {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # see the top of this file
    cmake_args = f"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'"
    env = {**os.environ, "CMAKE_ARGS": cmake_args, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
    pip = [str(python), "-m", "pip", "install", "-q", LLAMA_CPP_PYTHON, GGUF_PY, "numpy"]
    subprocess.run(pip, check=True, env=env)
    subprocess.run(check, check=True)
    return python


def prepare_models(python: Path, weights: Path, work: Path, layers: int, quant: str) -> dict[str, Path]:
    models = {}
    for narrow in (False, True):
        label = "narrow" if narrow else "full"
        target = work / f"model-v{MODEL_VERSION}-{layers}l-{label}-{quant}.gguf"
        if not target.is_file():
            print(f"==> writing {target.name} (gguf-py, llama_model_quantize)", flush=True)
            source = work / f"model-v{MODEL_VERSION}-{layers}l-{label}-bf16-source.gguf"
            if not source.is_file():
                _worker_call(python, "write-gguf", weights, layers, source, narrow)
            if quant in LATTICE:
                write_lattice_gguf(source, target, quant)
            elif quant == "nvfp4":
                write_nvfp4_gguf(source, target)
            else:
                _worker_call(python, "quantize", source, target, quant)
        models[label] = target
    return models


def _worker_call(python: Path, *args: Any) -> None:
    subprocess.run([str(python), __file__, "--worker", *map(str, args)], check=True)


def bytes_per_weight(quant: str) -> float:
    """The bytes a weight takes in llama.cpp's type, scales included (ktforge's ggml type table)."""
    from ktforge.checkpoints.gguf_file import ggml_types

    ggml = next(t for t in ggml_types().values() if t.name.lower() == quant)
    return ggml.block_bytes / ggml.block_values


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def compare(args: argparse.Namespace) -> None:
    work, layers = Path(args.work), args.layers
    work.mkdir(parents=True, exist_ok=True)
    python = ensure_venv(Path(args.venv))
    weights = write_weights(work, layers)
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = []
    for pair in args.pairs.split(","):
        quant, method = pair.split(":")
        models = prepare_models(python, weights, work, layers, quant)
        common = ["--layers", str(layers), "--threads", str(args.threads), "--max-tokens", str(max(tokens))]
        log = work / "workers.log"
        llama = [str(python), __file__, "--worker", "llama"]
        workers = {
            "full": Worker([*llama, str(models["full"]), str(weights), *common], log),
            "narrow": Worker([*llama, str(models["narrow"]), str(weights), *common], log),
            "ktforge": Worker(
                [sys.executable, __file__, "--worker", "ktforge", method, str(weights), *common]
                + (["--gguf", str(models["full"])] if method == "gguf" else []),
                log,
            ),
        }
        print(
            f"{quant} / {method}: weight error (rel. RMS) llama.cpp {workers['full'].hello['weight_rel_rms']:.4f}, "
            f"ktforge {workers['ktforge'].hello['weight_rel_rms']:.4f}; ktforge's layer against float64 "
            f"{workers['ktforge'].hello['layer_rel_err']:.4f}",
            flush=True,
        )
        for t in tokens:
            calls = args.calls if t <= DECODE_CONTEXT else max(3, args.calls // 10)
            per_round: dict[str, list[float]] = {"llama": [], "ktforge": [], "ratio": []}
            for _ in range(args.rounds):  # alternating: the machine's noise falls on both
                full = statistics.median(workers["full"].time_calls(t, calls))
                narrow = statistics.median(workers["narrow"].time_calls(t, calls))
                ours = statistics.median(workers["ktforge"].time_calls(t, calls))
                theirs = (full - narrow) / layers
                per_round["llama"].append(theirs)
                per_round["ktforge"].append(ours)
                per_round["ratio"].append(theirs / ours)
            rows.append((quant, method, t, per_round))
            print(
                f"  T={t}: experts per layer, llama.cpp {_median_range(per_round['llama'])} ms, ktforge "
                f"{_median_range(per_round['ktforge'])} ms; llama.cpp / ktforge {_median_range(per_round['ratio'])}",
                flush=True,
            )
        for w in workers.values():
            w.close()
    print(
        f"\n| experts per layer ({args.rounds} rounds, {args.threads} threads) | tokens | llama.cpp ms | ktforge ms "
        "| llama.cpp / ktforge |"
    )
    print("|---|---:|---:|---:|---:|")
    for quant, method, t, r in rows:
        bpw = bytes_per_weight(quant)
        print(
            f"| {quant.upper()} ({bpw:.4g} B/w) / {method} | {t} | {_median_range(r['llama'])} | "
            f"{_median_range(r['ktforge'])} | {_median_range(r['ratio'])} |"
        )


def worker(argv: list[str]) -> None:
    kind = argv[0]
    if kind == "write-gguf":
        write_gguf(Path(argv[1]), int(argv[2]), Path(argv[3]), argv[4] == "True")
        return
    if kind == "quantize":
        quantize_gguf(Path(argv[1]), Path(argv[2]), argv[3])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("what")
    parser.add_argument("weights")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--gguf", default=None)
    a = parser.parse_args(argv[1:])
    weights = Path(a.weights)
    if kind == "llama":
        model = LlamaModel(Path(a.what), a.threads, a.max_tokens)
        serve(model, {"weight_rel_rms": llama_weight_error(Path(a.what), weights)}, sys.stdout)
    else:
        layers = KtforgeLayers(weights, a.layers, a.what, a.threads, Path(a.gguf) if a.gguf else None)
        serve(layers, layers.accuracy(), sys.stdout)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":  # a step or a timing process of the run
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default=str(CACHE / "llama-cpp-noamx"), help="llama-cpp-python's virtualenv")
    parser.add_argument("--work", default=str(CACHE / "llama-cpp-compare"), help="weights and GGUF files (GBs)")
    parser.add_argument(
        "--pairs", default="bf16:bf16,q8_0:int8g,q8_0:int8,q4_0:int4", help="llama.cpp format:ktforge method"
    )
    parser.add_argument("--tokens", default="1,4,512")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40, help="timed calls a round for decode (a tenth for prefill)")
    compare(parser.parse_args())


if __name__ == "__main__":
    main()
