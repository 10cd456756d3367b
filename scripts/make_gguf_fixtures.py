"""Regenerates tests/fixtures/gguf/: tiny MoE GGUF files written by gguf-py's GGUFWriter and
quantized by llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize), one file per
type, plus a file whose gate, up and down each have their own type (an Unsloth "UD" mix), and a
split copy of one (`*-00001-of-00002.gguf`).

Not run by the tests or CI (they read the committed files; CI does not build llama.cpp). Run it
with a Python that has `gguf` and `llama-cpp-python` (a source build of llama.cpp, minutes):

    python -m venv /tmp/llama && /tmp/llama/bin/pip install gguf numpy llama-cpp-python
    /tmp/llama/bin/python scripts/make_gguf_fixtures.py tests/fixtures/gguf

`--mixed` remakes only the F32 file (the float32 source every other type is quantized from) and
the mixed-type files, from the per-type files already there (gguf-py alone: their tensors stay as
llama.cpp quantized them).

`--nvfp4 LLAMA_CPP` makes the NVFP4 file from the F32 one: compressed-tensors' NVFP4 quantizer,
then llama.cpp's converter's own packing of a ModelOpt checkpoint (LLAMA_CPP: the llama.cpp source,
for its conversion package), with each expert's tensor scale in a ``.scale`` tensor as it writes it.

`--iquants BIN` makes the i-quant files (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, and two mixes as
Unsloth's UD-Q2_K_XL and UD-IQ1_S have them) with llama.cpp's own tools in BIN: llama-imatrix
makes the importance matrix the 2-bit and 1-bit types need, from a runnable copy of the tiny model
(a byte vocabulary, attention) over a text of common words, and llama-quantize uses it. Build
them from the llama.cpp source that llama-cpp-python's sdist vendors:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # vendor/llama.cpp inside
    cmake -S llama.cpp -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF && \
      cmake --build build --target llama-quantize llama-imatrix -j
    python scripts/make_gguf_fixtures.py tests/fixtures/gguf --iquants build/bin
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

ARCH = "qwen3moe"
EXPERTS, TOP_K, HIDDEN, INTER, LAYERS, VOCAB = 4, 2, 256, 256, 1, 16  # K-quants need rows of 256

# file stem -> llama.cpp's file type, quantized "pure" (every 2-D+ weight in the type itself)
TYPES = {
    "BF16": "LLAMA_FTYPE_MOSTLY_BF16",
    "F16": "LLAMA_FTYPE_MOSTLY_F16",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "Q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q3_K": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "Q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "Q5_K": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    "MXFP4": "LLAMA_FTYPE_MOSTLY_MXFP4_MOE",
}
# files whose projections have types of their own, as Unsloth's "UD" quants and llama.cpp's _M mixes
MIXED = {
    "mixed": {"gate": "Q4_K", "up": "Q4_K", "down": "Q8_0"},
    "mixed-bf16": {"gate": "Q4_K", "up": "Q4_K", "down": "BF16"},
    "mixed-gate-up": {"gate": "Q4_K", "up": "Q4_0", "down": "Q4_K"},
    "mixed-q6k": {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K"},  # Q4_K_M's experts
    "mixed-q5k": {"gate": "Q5_K", "up": "Q5_K", "down": "Q6_K"},  # Q5_K_M's
}


def tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A Qwen3-MoE's expert layers, float32 in numpy's order (GGUF's ne reversed)."""
    out = {
        "token_embd.weight": rng.standard_normal((VOCAB, HIDDEN), np.float32) * 0.02,
        "output_norm.weight": np.ones(HIDDEN, np.float32),
    }
    for layer in range(LAYERS):
        out[f"blk.{layer}.ffn_gate_inp.weight"] = rng.standard_normal((EXPERTS, HIDDEN), np.float32) * 0.1
        for name, shape in (("gate", (INTER, HIDDEN)), ("up", (INTER, HIDDEN)), ("down", (HIDDEN, INTER))):
            # a spread of magnitudes per row, as trained weights have
            w = rng.standard_normal((EXPERTS, *shape), np.float32) * (0.02 + 0.05 * rng.random((EXPERTS, shape[0], 1)))
            out[f"blk.{layer}.ffn_{name}_exps.weight"] = w.astype(np.float32)
    return out


# A whole tiny model for transformers' GGUF loader (gguf_file=): attention too, and the expert
# intermediate size transformers assumes for qwen3_moe (its GGUF key map has no
# expert_feed_forward_length: Qwen3-30B-A3B's 768).
MODEL_INTER, HEADS, KV_HEADS, HEAD_DIM = 768, 4, 2, 64
BYTE_VOCAB = 3 + 256  # <unk>, <s>, </s> and a token per byte: llama.cpp's SPM tokenizer reads any text


def model_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {
        "token_embd.weight": rng.standard_normal((VOCAB, HIDDEN), np.float32) * 0.5,
        "output_norm.weight": np.ones(HIDDEN, np.float32),
        "output.weight": rng.standard_normal((VOCAB, HIDDEN), np.float32) * 0.05,
        "blk.0.attn_norm.weight": np.ones(HIDDEN, np.float32),
        "blk.0.ffn_norm.weight": np.ones(HIDDEN, np.float32),
        "blk.0.attn_q_norm.weight": np.ones(HEAD_DIM, np.float32),
        "blk.0.attn_k_norm.weight": np.ones(HEAD_DIM, np.float32),
        "blk.0.ffn_gate_inp.weight": rng.standard_normal((EXPERTS, HIDDEN), np.float32) * 0.5,
    }
    for name, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
        out[f"blk.0.attn_{name}.weight"] = rng.standard_normal((rows, HIDDEN), np.float32) * 0.05
    out["blk.0.attn_output.weight"] = rng.standard_normal((HIDDEN, HEADS * HEAD_DIM), np.float32) * 0.05
    for name, shape in (
        ("gate", (MODEL_INTER, HIDDEN)),
        ("up", (MODEL_INTER, HIDDEN)),
        ("down", (HIDDEN, MODEL_INTER)),
    ):
        out[f"blk.0.ffn_{name}_exps.weight"] = rng.standard_normal((EXPERTS, *shape), np.float32) * 0.05
    return out


def write_source(path: Path, arrays: dict[str, np.ndarray], inter: int = INTER, byte_vocabulary: bool = False) -> None:
    """A float32 qwen3moe GGUF of ``arrays``; ``byte_vocabulary``: with BYTE_VOCAB tokens (llama.cpp's
    SPM tokenizer: a token a byte), so llama.cpp can read text with it."""
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(inter)
    writer.add_expert_feed_forward_length(inter)
    writer.add_vocab_size(BYTE_VOCAB if byte_vocabulary else VOCAB)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(TOP_K)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if byte_vocabulary:
        writer.add_tokenizer_model("llama")
        writer.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)])
        writer.add_token_scores([0.0] * BYTE_VOCAB)
        writer.add_token_types([2, 3, 3] + [6] * 256)  # unknown, control, control, then bytes
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source: Path, out: Path, ftype: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    params.pure = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype}) returned {rc}")


def copy_with(out: Path, reader_of: dict[str, gguf.GGUFReader], base: gguf.GGUFReader, split: int = 0) -> None:
    """A GGUF of base's metadata whose expert tensors come from other quantized files (as they are,
    bytes and type), e.g. gate from a Q4_K file, up from a Q4_0 one; split > 0: that many tensors a file."""
    writer = gguf.GGUFWriter(str(out), ARCH, split_max_tensors=split)
    for field in base.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture", "split.")):
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for tensor in base.tensors:
        source = reader_of.get(tensor.name.split(".")[1 if tensor.name.startswith("blk.") else 0], base)
        if tensor.name.startswith("blk.") and "_exps" in tensor.name:
            projection = tensor.name.split(".")[2].removeprefix("ffn_").removesuffix("_exps")
            source = reader_of.get(projection, base)
        t = next(s for s in source.tensors if s.name == tensor.name)
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)  # the data's byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_mixed(target: Path) -> None:
    for stem, mix in MIXED.items():
        readers = {p: gguf.GGUFReader(target / f"qwen3moe-{t}.gguf") for p, t in mix.items()}
        copy_with(target / f"qwen3moe-{stem}.gguf", readers, readers["down"])


# the i-quant files: stem -> llama-quantize's type for every tensor (--pure), with the imatrix
IQUANTS = {"IQ2_XXS": "IQ2_XXS", "IQ2_XS": "IQ2_XS", "IQ3_XXS": "IQ3_XXS", "IQ1_S": "IQ1_S"}
# mixes as Unsloth's dynamic quants have them: the experts' types, the rest in the base type
IQUANT_MIXES = {
    "mixed-ud-q2_k_xl": ("Q4_K", {"ffn_gate_exps": "iq2_xs", "ffn_up_exps": "iq2_xs", "ffn_down_exps": "iq3_xxs"}),
    "mixed-ud-iq1_s": ("Q4_K", {"ffn_gate_exps": "iq1_s", "ffn_up_exps": "iq1_s", "ffn_down_exps": "iq2_xxs"}),
}


def write_runnable_source(path: Path, whole_model: bool = False) -> None:
    """The F32 fixture's experts and router (``whole_model``: the transformers model's, 768 wide) in
    a model llama.cpp runs: attention, norms, an output head and a byte vocabulary (what
    llama-imatrix needs to read a text)."""
    rng = np.random.default_rng(7 if whole_model else 2026)
    arrays = model_tensors(rng) if whole_model else tensors(rng)
    inter = MODEL_INTER if whole_model else INTER
    arrays["token_embd.weight"] = rng.standard_normal((BYTE_VOCAB, HIDDEN), np.float32) * 0.5
    arrays["output.weight"] = rng.standard_normal((BYTE_VOCAB, HIDDEN), np.float32) * 0.05
    for name, size in (
        ("attn_norm", HIDDEN),
        ("ffn_norm", HIDDEN),
        ("attn_q_norm", HEAD_DIM),
        ("attn_k_norm", HEAD_DIM),
    ):
        arrays[f"blk.0.{name}.weight"] = np.ones(size, np.float32)
    for name, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
        arrays[f"blk.0.attn_{name}.weight"] = rng.standard_normal((rows, HIDDEN), np.float32) * 0.05
    arrays["blk.0.attn_output.weight"] = rng.standard_normal((HIDDEN, HEADS * HEAD_DIM), np.float32) * 0.05
    write_source(path, arrays, inter, byte_vocabulary=True)


def write_iquants(target: Path, tools: Path) -> None:
    import os
    import subprocess

    env = {**os.environ, "LD_LIBRARY_PATH": str(tools)}
    with tempfile.TemporaryDirectory() as tmp:
        source, text, imatrix = Path(tmp) / "runnable-F32.gguf", Path(tmp) / "text.txt", Path(tmp) / "imatrix.gguf"
        write_runnable_source(source)
        words = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from"]
        text.write_text(" ".join(np.random.default_rng(1).choice(words, 4000)))
        run = [str(tools / "llama-imatrix"), "-m", str(source), "-f", str(text), "-o", str(imatrix), "-c", "128"]
        subprocess.run([*run, "-t", "2"], check=True, env=env, capture_output=True)
        quantize_tool = [str(tools / "llama-quantize"), "--imatrix", str(imatrix)]
        # the output head and the token embeddings have no importance data: Q4_K, as llama.cpp's mixes
        outside = ["--output-tensor-type", "q4_k", "--token-embedding-type", "q4_k"]
        for stem, kind in IQUANTS.items():
            out = target / f"qwen3moe-{stem}.gguf"
            run = [*quantize_tool, "--pure", *outside, str(source), str(out), kind, "2"]
            subprocess.run(run, check=True, env=env, capture_output=True)
        for stem, (base, types) in IQUANT_MIXES.items():
            overrides = [arg for name, kind in types.items() for arg in ("--tensor-type", f"{name}={kind}")]
            out = target / f"qwen3moe-{stem}.gguf"
            subprocess.run(
                [*quantize_tool, *overrides, str(source), str(out), base, "2"], check=True, env=env, capture_output=True
            )
        # the whole tiny model transformers loads (gguf_file=), its experts as UD-Q2_K_XL's
        model, model_imatrix = Path(tmp) / "model-runnable-F32.gguf", Path(tmp) / "model-imatrix.gguf"
        write_runnable_source(model, whole_model=True)
        run = [str(tools / "llama-imatrix"), "-m", str(model), "-f", str(text), "-o", str(model_imatrix), "-c", "128"]
        subprocess.run([*run, "-t", "2"], check=True, env=env, capture_output=True)
        base, types = IQUANT_MIXES["mixed-ud-q2_k_xl"]
        overrides = [arg for name, kind in types.items() for arg in ("--tensor-type", f"{name}={kind}")]
        run = [str(tools / "llama-quantize"), "--imatrix", str(model_imatrix), *overrides, str(model)]
        out = target / "qwen3moe-model-UD-Q2_K_XL.gguf"
        subprocess.run([*run, str(out), base, "2"], check=True, env=env, capture_output=True)


def main(folder: str, mixed_only: bool = False) -> int:
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    # F32: gguf-py's own floats, the very source the other types are quantized from
    write_source(target / "qwen3moe-F32.gguf", tensors(np.random.default_rng(2026)))
    if mixed_only:
        write_mixed(target)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source-F32.gguf"
        write_source(source, tensors(np.random.default_rng(2026)))
        for stem, ftype in TYPES.items():
            quantize(source, target / f"qwen3moe-{stem}.gguf", ftype)
        write_mixed(target)
        model_source = Path(tmp) / "model-F32.gguf"
        write_source(model_source, model_tensors(np.random.default_rng(7)), MODEL_INTER)
        quantize(model_source, target / "qwen3moe-model-Q4_K.gguf", TYPES["Q4_K"])
        split = target / "split"
        split.mkdir(exist_ok=True)
        q4k = gguf.GGUFReader(target / "qwen3moe-Q4_K.gguf")
        copy_with(split / "qwen3moe-Q4_K.gguf", {}, q4k, split=len(q4k.tensors) // 2 + 1)
    for path in sorted(target.rglob("*.gguf")):
        print(f"{path.relative_to(target)}: {path.stat().st_size} bytes")
    return 0


def nvfp4_modelopt(w: np.ndarray) -> tuple[object, object, float]:
    """compressed-tensors' NVFP4 of w [N, K] (its NVFP4A16 preset) in ModelOpt's layout: the packed
    codes (uint8 [N, K / 2]), weight_scale (float8_e4m3fn [N, K / 16]) and weight_scale_2 (1 / its
    global scale)."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    x = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    global_scale = generate_gparam(x.min(), x.max())
    groups = x.reshape(x.shape[0], -1, 16)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights, global_scale=global_scale)
    state = {"weight": x, "weight_scale": scale, "weight_global_scale": global_scale}
    packed = NVFP4PackedCompressor.compress(state, scheme)
    return packed["weight_packed"], packed["weight_scale"], float(1 / global_scale)


def write_nvfp4(target: Path, llama_cpp: Path) -> None:
    """qwen3moe-NVFP4.gguf: the F32 file's experts quantized by compressed-tensors' NVFP4 and packed
    as llama.cpp's converter packs a ModelOpt checkpoint (its ModelBase._nvfp4_pack, one tensor a
    projection; each expert's weight_scale_2 in the ``.scale`` tensor beside it); the rest as is."""
    sys.path.insert(0, str(llama_cpp))
    from conversion.base import ModelBase

    base = gguf.GGUFReader(target / "qwen3moe-F32.gguf")
    writer = gguf.GGUFWriter(str(target / "qwen3moe-NVFP4.gguf"), ARCH)
    for field in base.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in base.tensors:
        data = np.asarray(tensor.data)
        if "_exps.weight" not in tensor.name:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
            continue
        packed = [nvfp4_modelopt(expert) for expert in data]
        raws = [ModelBase._nvfp4_pack(codes, scale)[0] for codes, scale, _ in packed]
        writer.add_tensor(tensor.name, np.stack(raws), raw_dtype=gguf.GGMLQuantizationType.NVFP4)
        writer.add_tensor(tensor.name.replace(".weight", ".scale"), np.array([s for *_, s in packed], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--nvfp4" in argv:
        at = argv.index("--nvfp4")
        folder = Path(next((a for a in argv[:at] if not a.startswith("--")), "tests/fixtures/gguf"))
        write_nvfp4(folder, Path(argv[at + 1]).resolve())
        sys.exit(0)
    if "--iquants" in argv:
        at = argv.index("--iquants")
        folder = Path(next((a for a in argv[:at] if not a.startswith("--")), "tests/fixtures/gguf"))
        write_iquants(folder, Path(argv[at + 1]).resolve())
        sys.exit(0)
    args = [a for a in argv if a != "--mixed"]
    sys.exit(main(args[0] if args else "tests/fixtures/gguf", mixed_only="--mixed" in argv))
