"""ktforge in Hugging Face transformers: tiny random models of real architectures, built from
their configs with transformers' own classes (nothing downloaded), run with
experts_implementation="ktforge" against transformers' eager experts."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

import ktforge
import ktforge.transformers as kt_hf
from ktforge.kernels import torch_op

SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
# Each architecture's own names for its MoE sizes.
TINY: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "head_dim": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "mixtral": {"intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    "deepseek_v3": {
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "num_hidden_layers": 3,
    },
    "qwen2_moe": {
        "moe_intermediate_size": 32,
        "intermediate_size": 96,
        "shared_expert_intermediate_size": 48,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "olmoe": {"intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2},
}
# Tolerance of the logits against transformers' eager experts, relative to their largest value:
# the kernels round activations to each method's format (bf16: as the eager bf16 matmul does).
TOLERANCE = {"bf16": 2e-2, "int8": 6e-2, "int8g": 6e-2, "int4": 0.25, "fp8": 6e-2}


MARGIN = 0.5  # logits of |x| < 32 in bf16 are 1/8 apart: 4 steps of rounding


def tiny_model(model_type: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Any:
    config = AutoConfig.for_model(model_type, **{**SMALL, **TINY[model_type]})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # logits of a few tens, as trained models have
    return model


def confident(model: Any, prompt: torch.Tensor, new_tokens: int = 32) -> Any:
    """The model made sure of its own greedy continuation of ``prompt``, as a trained model is:
    a random one has near-ties between its top two logits (bf16 rounds many to exact ties), and
    a different rounding of the experts (any other implementation's) flips those. Each round
    raises the chosen token's output embedding along the final hidden state wherever its lead
    is under MARGIN, until every step of the eager trajectory leads by MARGIN; the experts still
    decide the hidden states. The leads are those of generate's own decode steps: torch's
    one-token matmuls round differently from a whole-sequence forward (on an AMX host its
    oneDNN kernels left a lead of 0 in decode where the forward showed 1.4). Checked: the
    returned model's trajectory has that margin."""
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        seen: list[torch.Tensor] = []
        hook = model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0][:, -1]))
        for _ in range(60):
            seen.clear()
            out = model.generate(
                prompt,
                max_new_tokens=new_tokens,
                do_sample=False,
                min_new_tokens=new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
            )
            hidden = torch.stack(seen, dim=1).float()  # [batch, step, hidden]: what the output embedding read
            top2 = torch.stack(out.logits, dim=1).float().topk(2, dim=-1).values
            lead = top2[..., 0] - top2[..., 1]
            if lead.min() >= MARGIN:
                hook.remove()
                return model
            weight = model.lm_head.weight
            chosen = out.sequences[:, prompt.shape[1] :]
            for b, t in (lead < MARGIN).nonzero().tolist():
                h = hidden[b, t]
                weight[chosen[b, t]] += (2 * MARGIN * h / h.dot(h)).to(weight.dtype)
    raise AssertionError("the tiny model did not become confident of its continuation")


def _prompt(batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def _experts_modules(model: Any) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "has_gate")]


@pytest.fixture(autouse=True)
def _default_settings() -> Any:
    before = kt_hf.settings()
    yield
    kt_hf.configure(**{f: getattr(before, f) for f in before.__dataclass_fields__})


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3", "mixtral", "qwen2_moe", "olmoe"])
def test_greedy_generation_is_identical_in_bf16(model_type: str) -> None:
    prompt = _prompt()
    model = confident(tiny_model(model_type), prompt)
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        eager = model.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)
        model.set_experts_implementation("ktforge")
        ours = model.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)
    assert ours.shape == eager.shape == (2, 12 + 32)
    assert torch.equal(ours, eager)
    # and the experts really ran on ktforge's kernels, every module of them
    modules = _experts_modules(model)
    assert modules and all(kt_hf.handle_of(m) for m in modules)


@pytest.mark.parametrize("method", ["bf16", "int8", "int8g", "int4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3", "mixtral"])
def test_logits_match_eager_within_the_method_s_tolerance(model_type: str, method: str, dtype: torch.dtype) -> None:
    kt_hf.configure(method=method, group_size=32)
    model = tiny_model(model_type, dtype)
    prompt = _prompt()
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        eager = model(prompt).logits.float()
        model.set_experts_implementation("ktforge")
        ours = model(prompt).logits.float()
    assert ours.dtype == eager.dtype and ours.shape == eager.shape
    err = float((ours - eager).abs().max() / eager.abs().max())
    assert err < TOLERANCE[method], err
    layer = kt_hf.packed_layer(_experts_modules(model)[0])
    assert layer.method == method


def test_from_pretrained_with_experts_implementation(tmp_path: Path) -> None:
    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="ktforge", dtype=torch.bfloat16)
    prompt = _prompt()
    with torch.inference_mode():
        ours = loaded(prompt).logits
    assert loaded.config._experts_implementation == "ktforge"
    assert all(kt_hf.handle_of(m) for m in _experts_modules(loaded))
    with torch.inference_mode():
        eager = model(prompt).logits  # the default implementation, same weights
    assert float((ours.float() - eager.float()).abs().max() / eager.float().abs().max()) < TOLERANCE["bf16"]


def _kt_convert(model_dir: Path, output: Path, *args: str) -> Path:
    """``kt convert`` of a saved model, as a user runs it."""
    from typer.testing import CliRunner

    from ktforge.cli.commands import app

    result = CliRunner().invoke(app, ["convert", "--input", str(model_dir), "--output", str(output), *args])
    assert result.exit_code == 0, result.output
    return output


@pytest.mark.parametrize("method", ["int8", "int8g", "int4"])
def test_experts_load_from_a_kt_convert_output(tmp_path: Path, method: str) -> None:
    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "model")
    converted = _kt_convert(tmp_path / "model", tmp_path / "converted", "--quant", method, "--group-size", "32")
    prompt = _prompt()

    # packed on first use from transformers' weights, for the same method
    kt_hf.configure(method=method, group_size=32)
    try:
        packed = AutoModelForCausalLM.from_pretrained(tmp_path / "model", experts_implementation="ktforge")
        with torch.inference_mode():
            want = packed(prompt).logits
    finally:
        kt_hf.configure(method="bf16", group_size=128)

    # the conversion: the same quantization, so the same logits to the bit
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")  # eager experts until loaded
    assert kt_hf.load_converted(loaded, converted) == [0, 1]
    assert loaded.config._experts_implementation == "ktforge"
    for module in _experts_modules(loaded):
        assert kt_hf.packed_layer(module).method == method
    with torch.inference_mode():
        got = loaded(prompt).logits
    assert torch.equal(got, want)


def test_load_converted_takes_the_layers_converted_and_refuses_another_model(tmp_path: Path) -> None:
    model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path / "model")
    _kt_convert(tmp_path / "model", tmp_path / "layer1", "--layers", "1")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.bfloat16)
    assert kt_hf.load_converted(loaded, tmp_path / "layer1") == [1]
    first, second = _experts_modules(loaded)
    assert kt_hf.handle_of(first) is None  # packed on first use, as usual
    assert kt_hf.packed_layer(second).method == "int8"
    with torch.inference_mode():
        loaded(_prompt())
    assert kt_hf.packed_layer(first).method == "bf16"

    other = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("qwen3_moe", **{**SMALL, **TINY["qwen3_moe"], "moe_intermediate_size": 48})
    )
    with pytest.raises(ValueError, match="not a conversion of this model"):
        kt_hf.load_converted(other, tmp_path / "layer1")
    with pytest.raises(ValueError, match="manifest"):
        kt_hf.load_converted(other, tmp_path)  # not a conversion at all


def test_an_unsupported_layout_falls_back_with_one_warning_and_the_same_answer() -> None:
    # GPT-OSS whose experts gate with a function of their own (not one the kernels know)
    config = AutoConfig.for_model(
        "gpt_oss",
        **{**SMALL, "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 16},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()

    def own_gate(self: Any, gate_up: torch.Tensor) -> torch.Tensor:
        return torch.tanh(gate_up[..., ::2]) * gate_up[..., 1::2]

    for module in _experts_modules(model):
        module.__class__ = type("TanhGateExperts", (type(module),), {"_apply_gate": own_gate})
    prompt = _prompt()
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        eager = model(prompt).logits
        model.set_experts_implementation("ktforge")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = model(prompt).logits
            model(prompt)  # the second call: no second warning
    messages = [str(w.message) for w in caught if "ktforge" in str(w.message)]
    reason = "it gates with its own function (TanhGateExperts._apply_gate)"
    assert messages == [f"ktforge: TanhGateExperts runs transformers' eager experts: {reason}"] * 2
    assert not any(kt_hf.handle_of(m) for m in _experts_modules(model))
    assert torch.equal(ours, eager)  # transformers' own code, so exactly its answer


@pytest.fixture(scope="module")
def sweep() -> list[tuple[str, str, str | None]]:
    return kt_hf.sweep()


def test_the_sweep_covers_every_architecture_of_the_interface(sweep: list[tuple[str, str, str | None]]) -> None:
    import importlib.util
    import pkgutil

    import transformers.models

    decorated = set()
    for info in pkgutil.iter_modules(transformers.models.__path__):
        spec = importlib.util.find_spec(f"transformers.models.{info.name}.modeling_{info.name}")
        if spec and spec.origin and "@use_experts_implementation" in Path(spec.origin).read_text():
            decorated.add(info.name)
    assert {model_type for model_type, _, _ in sweep} == decorated
    verdicts = {model_type: why for model_type, _, why in sweep}
    for supported in ("qwen3_moe", "deepseek_v3", "mixtral", "qwen2_moe", "olmoe", "glm4_moe", "lfm2_moe"):
        assert verdicts[supported] is None, (supported, verdicts[supported])
    for variant in ("gpt_oss", "deepseek_v4", "glm5_next", "hy_v4", "openai_privacy_filter"):  # SwiGLU variants
        assert verdicts[variant] is None, (variant, verdicts[variant])
    assert verdicts["nemotron_h"] == "its experts have no gate (a plain activation, not gate * up)"
    assert sum(why is None for why in verdicts.values()) >= 40


def test_release_torch_weights_keeps_one_copy() -> None:
    kt_hf.configure(release_torch_weights=True)
    model = tiny_model("mixtral")
    prompt = _prompt()
    with torch.inference_mode():
        model.set_experts_implementation("ktforge")
        before = model(prompt).logits
        for module in _experts_modules(model):
            assert module.gate_up_proj.numel() == 0 and module.down_proj.numel() == 0
        after = model(prompt).logits
    assert torch.equal(before, after)


def test_threads_follow_torch_unless_configured() -> None:
    model = tiny_model("olmoe")
    with torch.inference_mode():
        model.set_experts_implementation("ktforge")
        model(_prompt())
    layer = kt_hf.packed_layer(_experts_modules(model)[0])
    assert layer.info["threads"] == torch.get_num_threads()
    kt_hf.configure(threads=1)
    other = tiny_model("olmoe", seed=1)
    with torch.inference_mode():
        other.set_experts_implementation("ktforge")
        other(_prompt())
    assert kt_hf.packed_layer(_experts_modules(other)[0]).info["threads"] == 1
    # no oversubscription: each layer's pool has `threads` workers in all, the caller included
    tasks = len(list(Path("/proc/self/task").iterdir()))
    assert tasks < 64, f"{tasks} threads in this process"


def test_a_deleted_model_frees_its_layers() -> None:
    import gc

    def live_threads() -> int:
        return len(list(Path("/proc/self/task").iterdir()))

    kt_hf.configure(threads=3)
    try:
        model = tiny_model("qwen3_moe")
        with torch.inference_mode():
            model(_prompt())  # torch's own threads start here, not in what is counted
        gc.collect()  # earlier tests' models go first
        before = live_threads()
        with torch.inference_mode():
            model.set_experts_implementation("ktforge")
            model(_prompt())
        handles = [kt_hf.handle_of(m) for m in _experts_modules(model)]
        assert len(handles) == 2
        # the layers share one pool of 2 workers beside the caller (made now, or already there)
        assert before <= live_threads() <= before + 2
        assert all(torch_op.layer(h).info["pool_layers"] >= len(handles) for h in handles)
    finally:
        kt_hf.configure(threads=None)
    del model
    gc.collect()
    for handle in handles:
        with pytest.raises(ValueError, match="no ktforge layer"):
            torch_op.layer(handle)
    assert live_threads() == before


def test_configure_rejects_what_the_kernels_do_not_take() -> None:
    with pytest.raises(ValueError, match="method"):
        kt_hf.configure(method="fp4")
    with pytest.raises(TypeError, match="unknown setting"):
        kt_hf.configure(metod="bf16")
    assert kt_hf.settings().method == "bf16"


def _registered_layer(handle: int, method: str, seed: int) -> ktforge.MoE:
    """A small layer (4 experts of 32 x 32, top-2) registered with the operator under ``handle``."""
    E, k, H, I = 4, 2, 32, 32
    rng = np.random.default_rng(seed)
    w = [torch.from_numpy((rng.standard_normal(s) / 8).astype(np.float32)) for s in ((E, I, H), (E, I, H), (E, H, I))]
    layer = ktforge.MoE(E, k, H, I, method=method)
    layer.load_weights(*w)
    torch_op.register_layer(handle, layer)
    return layer


def test_the_operator_traces_under_torch_compile_fullgraph() -> None:
    _registered_layer(10_000, "bf16", 0)
    k, H = 2, 32
    x = torch.randn(5, H)
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]])
    weights = torch.full((5, k), 0.5)

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.relu(torch.ops.ktforge.moe(x * 2, ids, weights, 10_000)) + 1

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        expected = block(x)
        before = torch_op.time_spent()
        assert torch.equal(compiled(x), expected)
        after = torch_op.time_spent()  # what a benchmark reads for the experts' share of a run
        assert after["calls"] == before["calls"] + 1 and after["tokens"] == before["tokens"] + 5
        assert after["seconds"] > before["seconds"]
        bf16 = torch.ops.ktforge.moe(x.bfloat16(), ids, weights, 10_000)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == x.shape
    with pytest.raises(ValueError, match="no ktforge layer"):
        torch.ops.ktforge.moe(x, ids, weights, 99_999)


def test_the_operator_gives_nan_for_tokens_with_nan_as_torch_operators_do() -> None:
    # an engine's warm-up runs on placeholder values (vLLM's profile run): a token's NaN must not
    # fail the call, nor reach the other tokens; a wrong expert id is still refused
    layer = _registered_layer(10_001, "int8", 1)
    E, k, H = 4, 2, 32
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]])
    x, weights = torch.randn(6, H), torch.rand(6, k)
    expected = torch.ops.ktforge.moe(x, ids, weights, 10_001)
    x[1, 5], weights[4, 1] = float("nan"), float("inf")
    with pytest.raises(ValueError, match="NaN"):
        layer.forward(x, ids, weights)  # the Python API refuses them
    out = torch.ops.ktforge.moe(x, ids, weights, 10_001)
    assert out[[1, 4]].isnan().all()
    clean = [0, 2, 3, 5]
    assert torch.allclose(out[clean], expected[clean], rtol=0, atol=1e-6)  # int8: a token's own scale alone
    ids[2, 0] = E
    with pytest.raises(ValueError, match="outside"):
        torch.ops.ktforge.moe(x, ids, weights, 10_001)
    torch_op.unregister_layer(10_001)


def test_registered_in_transformers_interface() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert ALL_EXPERTS_FUNCTIONS["ktforge"] is kt_hf.experts_forward
    assert transformers.__version__.startswith("5.")


# ---- packed experts stay tied to the tensors they came from ------------------------------------


def _logits(model: Any, implementation: str, prompt: torch.Tensor | None = None) -> torch.Tensor:
    with torch.inference_mode():
        model.set_experts_implementation(implementation)
        return model(_prompt() if prompt is None else prompt).logits.float()


def _close_to_eager(model: Any) -> float:
    eager = _logits(model, "eager")
    ours = _logits(model, "ktforge")
    return float((ours - eager).abs().max() / eager.abs().max())


def test_an_in_place_update_is_packed_again() -> None:
    model = tiny_model("qwen3_moe")
    first = _logits(model, "ktforge")
    with torch.no_grad():
        for module in _experts_modules(model):
            module.down_proj.mul_(-1.0)  # a fine-tuning step, in place
    assert _close_to_eager(model) < TOLERANCE["bf16"]
    assert not torch.equal(_logits(model, "ktforge"), first)


def test_load_state_dict_and_replaced_parameters_are_packed_again() -> None:
    model, other = tiny_model("qwen3_moe"), tiny_model("qwen3_moe", seed=7)
    _logits(model, "ktforge")  # packed
    model.load_state_dict(other.state_dict())
    assert _close_to_eager(model) < TOLERANCE["bf16"]
    assert torch.allclose(_logits(model, "eager"), _logits(other, "eager"))
    module = _experts_modules(model)[0]
    module.gate_up_proj = torch.nn.Parameter(module.gate_up_proj.detach() * 0.5)
    assert _close_to_eager(model) < TOLERANCE["bf16"]


def test_a_deep_copy_packs_its_own_experts() -> None:
    import copy
    import gc

    original = tiny_model("qwen3_moe")
    before = _logits(original, "ktforge")
    clone = copy.deepcopy(original)
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(clone))  # nothing shared
    with torch.no_grad():
        for module in _experts_modules(clone):
            module.gate_up_proj.mul_(2.0)
    assert _close_to_eager(clone) < TOLERANCE["bf16"]
    assert torch.equal(_logits(original, "ktforge"), before)
    del original
    gc.collect()
    assert _close_to_eager(clone) < TOLERANCE["bf16"]


def test_a_pickled_model_never_runs_another_model_s_experts() -> None:
    import io

    first, second = tiny_model("qwen3_moe"), tiny_model("qwen3_moe", seed=3)
    _logits(second, "ktforge")
    buffer = io.BytesIO()
    torch.save(second, buffer)  # packed: what it carries must not name a layer of this process
    del second
    _logits(first, "ktforge")  # another model packed in this process meanwhile
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(loaded))
    assert _close_to_eager(loaded) < TOLERANCE["bf16"]


def test_load_converted_refuses_another_model_of_the_same_sizes(tmp_path: Path) -> None:
    base, instruct = tiny_model("qwen3_moe"), tiny_model("qwen3_moe", seed=5)
    base.save_pretrained(tmp_path / "base")
    _kt_convert(tmp_path / "base", tmp_path / "converted", "--quant", "int8")
    with pytest.raises(ValueError, match=r"does not hold this model.s weights.*weights differ"):
        kt_hf.load_converted(instruct, tmp_path / "converted")
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(instruct))  # nothing changed
    # the same model, loaded in another dtype, is accepted (its values round to the same)
    same = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    assert kt_hf.load_converted(same, tmp_path / "converted") == [0, 1]


@pytest.mark.parametrize("expert", [1, 5])
def test_load_converted_refuses_a_model_that_differs_in_one_expert(tmp_path: Path, expert: int) -> None:
    """An expert-specialised fine-tune: one of 8 experts changed (not the first, middle or last,
    which a sampled fingerprint would have checked alone)."""
    base = tiny_model("qwen3_moe")
    base.save_pretrained(tmp_path / "base")
    _kt_convert(tmp_path / "base", tmp_path / "converted", "--quant", "int8")
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.bfloat16)
    with torch.no_grad():
        _experts_modules(tuned)[1].down_proj[expert].mul_(1.1)
    with pytest.raises(ValueError, match=rf"does not hold this model.s weights.*expert {expert}'s down weights differ"):
        kt_hf.load_converted(tuned, tmp_path / "converted")
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(tuned))  # nothing changed


@pytest.mark.parametrize("backend", ["eager", "inductor"])
# torch 2.13's inductor itself still calls torch.jit.script_method, which it deprecates
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_of_the_model_runs_the_kernels(backend: str) -> None:
    """torch.compile(model) with the ktforge experts, compiled before anything was packed: the layer
    lookup and packing run eagerly (a graph break), the kernels as the custom op in the graph."""
    model = tiny_model("qwen3_moe")
    model.set_experts_implementation("ktforge")
    compiled = torch.compile(model, backend=backend)
    prompt = _prompt()
    with torch.no_grad():  # not inference mode: autograd's view of the parameters is traced too
        got = compiled(prompt).logits.float()
        again = compiled(prompt[:, :5]).logits.float()  # another length: a recompile or a dynamic shape
    assert all(kt_hf.handle_of(m) is not None for m in _experts_modules(model))
    ours = _logits(model, "ktforge")
    assert float((got - ours).abs().max() / ours.abs().max()) < TOLERANCE["bf16"]
    assert float((again - _logits(model, "ktforge", prompt[:, :5])).abs().max() / ours.abs().max()) < TOLERANCE["bf16"]
    assert _close_to_eager(model) < TOLERANCE["bf16"]


def test_a_dtype_the_kernels_do_not_take_falls_back_after_packing() -> None:
    model = tiny_model("mixtral", dtype=torch.float32)
    _logits(model, "ktforge")
    model.double()
    with pytest.warns(UserWarning, match="runs transformers' eager experts: its gate_up_proj is torch.float64"):
        ours = _logits(model, "ktforge")
    assert torch.equal(ours, _logits(model, "eager"))
    assert all(kt_hf.handle_of(m) is None for m in _experts_modules(model))
    model.float()  # back on the kernels
    assert _close_to_eager(model) < TOLERANCE["bf16"]
    assert all(kt_hf.handle_of(m) for m in _experts_modules(model))


def test_released_weights_refuse_what_would_read_them(tmp_path: Path) -> None:
    kt_hf.configure(release_torch_weights=True)
    model = tiny_model("qwen3_moe")
    _logits(model, "ktforge")
    with pytest.raises(RuntimeError, match=r"release_torch_weights=True"):
        model.save_pretrained(tmp_path / "saved")
    with pytest.raises(RuntimeError, match=r"release_torch_weights=True.*'eager' experts"):
        _logits(model, "eager")
    import copy

    with pytest.raises(RuntimeError, match=r"release_torch_weights=True.*a copy of it"):
        _logits(copy.deepcopy(model), "ktforge")
    with pytest.raises(RuntimeError, match=r"release_torch_weights=True"):
        model.double()
        _logits(model, "ktforge")


@pytest.mark.parametrize(
    "setting",
    [
        {"threads": 0},
        {"threads": -3},
        {"threads": "2"},
        {"threads": 10**6},
        {"threads": True},
        {"release_torch_weights": "no"},
        {"group_size": "32"},
        {"backend": 3},
    ],
    ids=str,
)
def test_configure_refuses_values_it_cannot_use(setting: dict[str, Any]) -> None:
    before = kt_hf.settings()
    with pytest.raises(ValueError, match=next(iter(setting))):
        kt_hf.configure(**setting)
    assert kt_hf.settings() == before
