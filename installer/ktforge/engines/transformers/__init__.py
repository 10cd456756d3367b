"""ktforge inside Hugging Face transformers: ``experts_implementation="ktforge"``.

``import ktforge.transformers`` registers "ktforge" in transformers' experts interface
(``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``), so that::

    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="ktforge")
    model.set_experts_implementation("ktforge")          # or on a loaded model

run every routed-experts module of the model on ktforge's kernels; the router, shared experts
and attention stay in torch. Each experts module is packed once, on its first call, for the
method of :func:`configure` (bf16 by default), and runs through the ``ktforge::moe`` torch
operator (:mod:`ktforge.kernels.torch_op`: ``torch.compile(fullgraph=True)`` traces it).
:func:`load_converted` takes the experts from a ``kt convert`` output instead.

A module whose layout the kernels do not compute (biases, no gate, a gating function or an
activation other than SiLU, a post-expert norm, expert parallelism, weights off the CPU) runs
transformers' own eager experts, after one warning naming the module and the reason: never a
wrong answer.

Threads: ktforge's pool takes ``torch.get_num_threads()`` threads by default, the same cores
torch uses; the two run one after the other (attention, then experts), not at once. Set
``OMP_WAIT_POLICY=PASSIVE`` before torch starts so its idle OpenMP workers sleep instead of
spinning on those cores while ktforge computes.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch

import ktforge
from ktforge.files import shown
from ktforge.kernels import MAX_THREADS, torch_op

NAME = "ktforge"


@dataclasses.dataclass(frozen=True)
class Settings:
    method: str = "bf16"  # bf16, int8, int8g or int4
    group_size: int = 128  # int8g and int4
    threads: int | None = None  # None: torch.get_num_threads()
    backend: str = "auto"
    release_torch_weights: bool = False  # drop transformers' copy once packed: one copy in memory


_settings = Settings()
_lock = threading.Lock()
_ids = itertools.count(1)


@dataclasses.dataclass
class _Packed:
    """An experts module's packed layer, tied to the exact parameters it was packed from."""

    handle: int  # ktforge::moe's handle: this process's, never stored on the module (never pickled or copied)
    source: _Source  # the parameters it was packed from, as they were
    released: bool  # transformers' copy was freed (release_torch_weights)


# Per module, not in the module's __dict__: copy.deepcopy, pickling and torch.save never carry a
# handle to another module, process or model, which then packs its own on first use.
_packed: weakref.WeakKeyDictionary[Any, _Packed] = weakref.WeakKeyDictionary()
_fallbacks: weakref.WeakKeyDictionary[Any, tuple[str, Any]] = weakref.WeakKeyDictionary()


def configure(**changes: Any) -> Settings:
    """Set how experts modules are packed from now on (modules already packed keep theirs):
    ``method``, ``group_size``, ``threads``, ``backend``, ``release_torch_weights``."""
    global _settings
    unknown = set(changes) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(sorted(unknown))}; known: {_known()}")
    threads = changes.get("threads")
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS
    ):
        raise ValueError(
            f"threads must be None (torch's) or a whole number from 1 to {MAX_THREADS}, got {shown(threads)}"
        )
    if not isinstance(changes.get("release_torch_weights", False), bool):
        raise ValueError(f"release_torch_weights must be True or False, got {shown(changes['release_torch_weights'])}")
    for name in ("method", "backend"):
        if name in changes and not isinstance(changes[name], str):
            raise ValueError(f"{name} must be a string, got {shown(changes[name])}")
    group = changes.get("group_size", 128)
    if not isinstance(group, int) or isinstance(group, bool):
        raise ValueError(f"group_size must be a whole number, got {shown(group)}")
    candidate = dataclasses.replace(_settings, **changes)
    ktforge.MoE(2, 1, 16, 16, method=candidate.method, group_size=candidate.group_size, backend=candidate.backend)
    _settings = candidate
    return _settings


def settings() -> Settings:
    return _settings


def _known() -> str:
    return ", ".join(f.name for f in dataclasses.fields(Settings))


KERNEL_DTYPES = ("float32", "bfloat16", "float16")  # float16 is widened to float32


# The gating functions of transformers' experts classes that the kernels compute, by the class
# that defines ``_apply_gate``: the activation's settings (ktforge.MoE's swiglu_alpha,
# swiglu_limit, up_offset) read from the module, and whether it applies the module's act_fn
# (which must then be SiLU). Each is one of: clamped SwiGLU (gate.clamp(max=limit),
# up.clamp(-limit, limit), silu(gate) * up), or gpt-oss's (the same clamps, gate *
# sigmoid(alpha * gate) * (up + 1)).
def _gpt_oss_gate(module: Any) -> dict[str, Any]:
    return {"swiglu_alpha": module.alpha, "swiglu_limit": module.limit, "up_offset": 1.0}


_GATES: dict[str, tuple[Any, bool]] = {
    "GptOssExperts": (_gpt_oss_gate, False),
    "OpenAIPrivacyFilterExperts": (_gpt_oss_gate, False),
    "MiniMaxM3VLExperts": (
        lambda m: {"swiglu_alpha": m.swiglu_alpha, "swiglu_limit": m.swiglu_limit, "up_offset": 1.0},
        False,
    ),
    "DeepseekV4Experts": (lambda m: {"swiglu_limit": m.limit}, True),
    "Glm5NextTextExperts": (lambda m: {"swiglu_limit": m.swiglu_limit}, False),
    "HYV4Experts": (lambda m: {"swiglu_limit": m.swiglu_limit}, False),
}


def _gate_of(module: Any) -> tuple[Any, bool] | None:
    """The module's gating function as _GATES knows it (None: transformers' default one)."""
    function = type(module)._apply_gate
    owner = function.__qualname__.rsplit(".", 1)[0]
    if owner in _GATES and function.__module__.startswith("transformers.models."):
        return _GATES[owner]
    return None


def activation_of(module: Any) -> dict[str, Any]:
    """The ktforge.MoE activation settings that compute this module's gating (``{}``: SwiGLU)."""
    gate = _gate_of(module)
    # a limit of None (a config without one): no clamp
    return {} if gate is None else {k: float(v) for k, v in gate[0](module).items() if v is not None}


def why_unsupported(module: Any, *, layout_only: bool = False) -> str | None:
    """Why the kernels cannot compute this experts module exactly (None: they can).
    ``layout_only``: judge the layout, not where the weights are (a module on the meta device)."""
    import torch
    from transformers.integrations import moe as hf_moe

    if getattr(module, "has_bias", False) and not all(
        isinstance(getattr(module, name, None), torch.Tensor) and getattr(module, name).ndim == 2
        for name in ("gate_up_proj_bias", "down_proj_bias")
    ):
        return "its experts have biases other than gate_up_proj_bias and down_proj_bias [E, N]"
    if not getattr(module, "has_gate", True):
        return "its experts have no gate (a plain activation, not gate * up)"
    if getattr(module, "has_post_expert_norm", False):
        return "it normalizes each expert's output"
    if getattr(module, "_is_expert_parallel", False):
        return "its experts are split across processes (expert parallelism)"
    known = _gate_of(module)
    if type(module)._apply_gate is not hf_moe._default_apply_gate and known is None:
        return f"it gates with its own function ({type(module).__name__}._apply_gate)"
    act = getattr(module, "act_fn", None)
    if (known is None or known[1]) and not (
        type(act).__name__ in ("SiLU", "SiLUActivation") or act is torch.nn.functional.silu
    ):
        return f"its activation is {getattr(act, '__name__', type(act).__name__)}, not SiLU"
    for name in ("gate_up_proj", "down_proj"):
        weight = getattr(module, name, None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 3:
            return f"it has no 3-D {name}"
        if weight.device.type != "cpu" and not layout_only:
            return f"its {name} is on {weight.device}"
        if str(weight.dtype).removeprefix("torch.") not in KERNEL_DTYPES and not layout_only:
            return f"its {name} is {weight.dtype}"
    return None


def _projections(module: Any) -> tuple[Any, Any, Any]:
    """The module's gate, up [E, I, H] and down [E, H, I] (views of its parameters)."""
    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    if getattr(module, "is_transposed", False):  # [E, H, 2I] and [E, I, H]
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    inter = gate_up.shape[1] // 2
    if getattr(module, "is_concatenated", True):
        return gate_up[:, :inter], gate_up[:, inter:], down
    return gate_up[:, 0::2], gate_up[:, 1::2], down  # interleaved: gate0, up0, gate1, up1, ...


@dataclasses.dataclass(frozen=True)
class _Source:
    """What identifies a module's parameters' current values: a replaced parameter (or
    ``.data``), an in-place update or ``load_state_dict`` (a version bump), a new dtype or shape
    each change it. The parameters are held weakly and compared by identity (an id alone could
    be reused by a new parameter at the old one's address)."""

    params: tuple[Any, ...]  # weak references
    state: tuple[Any, ...]

    def matches(self, other: _Source) -> bool:
        return self.state == other.state and all(
            a() is not None and a() is b() for a, b in zip(self.params, other.params, strict=True)
        )


def _source(module: Any) -> _Source:
    params, state = [], []
    biases = ("gate_up_proj_bias", "down_proj_bias") if getattr(module, "has_bias", False) else ()
    for name in ("gate_up_proj", "down_proj", *biases):
        p = getattr(module, name, None)
        try:
            version = p._version  # type: ignore[union-attr]
        except (AttributeError, RuntimeError):  # an inference tensor has no version counter
            version = None
        params.append(weakref.ref(p) if p is not None else (lambda: None))
        shape = tuple(getattr(p, "shape", ()))
        state += [getattr(p, "data_ptr", lambda: 0)(), version, shape, getattr(p, "dtype", None)]
    return _Source(tuple(params), tuple(state))


def _pack(module: Any, top_k: int) -> ktforge.MoE:
    """The module's weights packed into a ktforge layer."""
    import torch

    gate, up, down = _projections(module)
    experts, inter, hidden = gate.shape
    dtype = torch.float32 if gate.dtype == torch.float16 else gate.dtype  # the kernels take fp32 or bf16

    def ready(t: Any) -> Any:
        return t.to(dtype).contiguous()

    s = _settings
    layer = ktforge.MoE(
        experts,
        top_k,
        hidden,
        inter,
        method=s.method,
        group_size=s.group_size,
        backend=s.backend,
        threads=s.threads or torch.get_num_threads(),
        **activation_of(module),
    )
    layer.load_weights(ready(gate), ready(up), ready(down))
    _load_module_biases(module, layer)
    return layer


def _load_module_biases(module: Any, layer: ktforge.MoE) -> None:
    """The module's expert biases (gpt-oss) into the layer: gate and up split as the weights are."""
    if not getattr(module, "has_bias", False):
        return
    gate_up = module.gate_up_proj_bias.detach().float()
    inter = gate_up.shape[1] // 2
    if getattr(module, "is_concatenated", True):
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
    else:  # interleaved, as the weights
        gate, up = gate_up[:, 0::2], gate_up[:, 1::2]
    layer.load_biases(gate.contiguous(), up.contiguous(), module.down_proj_bias.detach().float().contiguous())


def _install(module: Any, layer: ktforge.MoE, release: bool | None = None) -> _Packed:
    """Registers ``layer`` as ``module``'s experts (replacing what it had); call under _lock.
    ``release``: free transformers' copy (None: as release_torch_weights says)."""
    handle = next(_ids)
    torch_op.register_layer(handle, layer)
    # the layer (packed weights, threads) lives as long as the module: a model deleted frees it
    weakref.finalize(module, torch_op.unregister_layer, handle)
    old = _packed.get(module)
    if old is not None:
        torch_op.unregister_layer(old.handle)
    _fallbacks.pop(module, None)
    released = _settings.release_torch_weights if release is None else release
    if released:
        # transformers' copy is no longer read: keep the parameters' identity, free their storage
        module.gate_up_proj.data = module.gate_up_proj.data.new_empty(0)
        module.down_proj.data = module.down_proj.data.new_empty(0)
        _guard_released(module)
    packed = _packed[module] = _Packed(handle, _source(module), released)
    return packed


def _guard_released(module: Any) -> None:
    """Once transformers' copy is freed, what would read it refuses, naming the setting: the
    eager experts and ``state_dict`` (``save_pretrained``)."""
    if getattr(module, "_ktforge_guarded", False):
        return
    module._ktforge_guarded = True
    # module-level hooks, not closures over the module: a copy's hooks must not keep the original alive
    module.register_forward_pre_hook(_refuse_released_eager)
    module.register_state_dict_pre_hook(_refuse_released_state_dict)


def _released_message(module: Any, what: str) -> str:
    return (
        f"ktforge: {type(module).__name__}'s weights were released when ktforge packed them "
        f"(configure(release_torch_weights=True)), so {what} cannot read them; load the model again "
        "without that setting to use them"
    )


def _refuse_released_eager(module: Any, _args: Any) -> None:
    packed = _packed.get(module)
    if packed is not None and packed.released and module.config._experts_implementation != NAME:
        raise RuntimeError(_released_message(module, f"the {shown(module.config._experts_implementation)} experts"))


def _refuse_released_state_dict(module: Any, *_: Any) -> None:
    packed = _packed.get(module)
    if packed is not None and packed.released:
        raise RuntimeError(_released_message(module, "state_dict() and save_pretrained()"))


def handle_of(module: Any) -> int | None:
    """``module``'s handle of the ``ktforge::moe`` operator (None: not packed, or it falls back)."""
    packed = _packed.get(module)
    return None if packed is None else packed.handle


def packed_layer(module: Any) -> ktforge.MoE | None:
    """The ktforge layer ``module``'s experts run on (None: not packed, or it falls back)."""
    handle = handle_of(module)
    return None if handle is None else torch_op.layer(handle)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def load_converted(model: Any, path: str | Path, *, verify: bool = True) -> list[int]:
    """Run ``model``'s routed experts from a ``kt convert`` output instead of packing
    transformers' weights: each experts module of a converted layer (``model.layers.N...``)
    loads layer N of the conversion (its method and group size; checksums verified unless
    ``verify=False``), with the threads and backend of :func:`configure`. Layers the
    conversion lacks are packed from transformers' weights on first use, as usual. Switches
    the model to ``experts_implementation="ktforge"``.

    The conversion must be of this model's weights: its fingerprint of the source (sketches of
    sampled rows, recorded by ``kt convert``) is compared with the module's own weights
    (``verify=False`` skips this too). Returns the layers loaded.

    Raises ValueError when the conversion is not of this model (its sizes or weights differ)
    or a converted layer's module is one the kernels cannot compute."""
    import torch

    from ktforge.checkpoints import convert, fingerprint

    directory = Path(path)
    manifest = convert.read_manifest(directory)
    converted = {int(layer) for layer in manifest["layers"]}
    sizes = (manifest["num_experts"], 2 * manifest["intermediate_size"], manifest["hidden_size"])
    layers: list[tuple[Any, ktforge.MoE, int]] = []
    for name, module, index in _modules_of_layers(model, converted, directory, sizes, "a conversion"):
        if verify:
            entry = manifest["layers"][str(index)]
            recorded = entry.get("fingerprint")
            if recorded is None:
                raise ValueError(
                    f"{directory}: layer {entry['file']} records no fingerprint of its source weights (converted "
                    "by an older ktforge), so it cannot be checked against this model; convert again, or pass "
                    "verify=False"
                )
            if not fingerprint.valid(recorded):
                raise ValueError(
                    f"{directory}/manifest.json: damaged (the fingerprint of {entry['file']}); convert again"
                )
            _check_fingerprint(directory, recorded, name, module, "convert this model")
        layer = ktforge.MoE.from_pretrained(
            directory,
            index,
            backend=_settings.backend,
            threads=_settings.threads or torch.get_num_threads(),
            verify=verify,
            activation=activation_of(module),
        )
        _load_module_biases(module, layer)
        layers.append((module, layer, index))
    return _install_loaded(model, layers)


def load_checkpoint(model: Any, path: str | Path) -> list[int]:
    """Run ``model``'s routed experts from the files of the checkpoint it was loaded from, in
    their own format: FP8 and packed INT4 experts as they are stored (methods "fp8" and "int4":
    the file's codes and scales, where transformers, on a CPU, dequantizes them to bf16), others
    packed for the method of :func:`configure`. Transformers' copy of each loaded module's experts is then
    freed, so one copy stays in memory (the eager experts and ``state_dict`` refuse, as with
    ``release_torch_weights``). Switches the model to ``experts_implementation="ktforge"``.
    ``path`` may be a GGUF (the file transformers loaded with ``gguf_file=``, split parts or
    their directory): its experts run on the file's own quantized values, not transformers'
    dequantized copy.

    The checkpoint must hold this model's weights: sketches of sampled rows of every expert
    are compared with the module's own (up to bf16 rounding). Returns the layers loaded;
    raises ValueError naming what differs."""
    from ktforge.checkpoints import gguf

    directory = Path(path)
    if gguf.is_gguf(directory):
        from ktforge.engines.transformers.gguf import load_gguf

        return load_gguf(model, directory)
    from ktforge.engines.transformers.release import load_release

    return load_release(model, directory)


def _modules_of_layers(
    model: Any, layers: set[int], directory: Path, sizes: tuple[int, int, int], source: str
) -> list[tuple[str, Any, int]]:
    """The experts modules of ``model`` at ``layers`` (``model.layers.N...``), each checked to be one
    the kernels compute and of ``sizes`` (experts, 2 x intermediate, hidden)."""
    from ktforge.checkpoints import convert

    modules = [
        (name, module, int(match.group(1)))
        for name, module in model.named_modules()
        if hasattr(module, "gate_up_proj") and hasattr(module, "has_gate")
        for match in [_LAYER_INDEX.search(name + ".")]
        if match is not None and int(match.group(1)) in layers
    ]
    if not modules:
        raise ValueError(
            f"{directory}: none of its layers ({convert.format_layers(sorted(layers))}) is an experts module "
            f"of this {type(model).__name__}"
        )
    for name, module, _ in modules:
        packed = _packed.get(module)
        if packed is not None and packed.released:
            raise ValueError(
                f"{name}'s experts were already loaded by ktforge (load_checkpoint, or packing with "
                "release_torch_weights) and transformers' copy released: they run on ktforge now; to load "
                f"{directory} instead, load the model again first"
            )
        reason = why_unsupported(module, layout_only=True)
        if reason is not None:
            raise ValueError(f"{name} cannot run on ktforge's kernels: {reason}")
        shape = tuple(module.gate_up_proj.shape)
        if getattr(module, "is_transposed", False):
            shape = (shape[0], shape[2], shape[1])
        if shape != sizes:
            raise ValueError(
                f"{directory} is not {source} of this model: {name} has experts x 2*intermediate x hidden "
                f"{shape}, the files {sizes}"
            )
    return modules


def _install_loaded(model: Any, layers: list[tuple[Any, ktforge.MoE, int]], release: bool | None = None) -> list[int]:
    """Installs every (module, layer, index) once all are read and checked; the layers' indices."""
    with _lock:
        for module, layer, _ in layers:
            _install(module, layer, release)
    model.set_experts_implementation(NAME)
    return sorted({index for _, _, index in layers})


def _check_fingerprint(
    directory: Path, recorded: dict[str, Any] | list[dict[str, Any]], name: str, module: Any, remedy: str
) -> None:
    """The module's weights are the ones a fingerprint was recorded from (any of several), or a
    ValueError saying where the first differs."""
    from ktforge.checkpoints import fingerprint

    projections = dict(zip(fingerprint.PROJECTIONS, _projections(module), strict=True))

    def rows_of(expert: int, projection: str) -> Any:
        weights = projections[projection][expert]
        return weights[fingerprint.sampled(weights.shape[0])].float().numpy()

    reasons = [fingerprint.mismatch(r, projections["gate"].shape[0], rows_of) for r in _as_list(recorded)]
    why = reasons[0] if None not in reasons else None
    if why is not None:
        raise ValueError(
            f"{directory} does not hold this model's weights: {name}: {why} (another model of the same sizes, or "
            f"weights changed since; {remedy})"
        )


def _as_list(recorded: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return recorded if isinstance(recorded, list) else [recorded]


def _layer_for(module: Any, hidden_states: Any, top_k: int) -> int | None:
    """The handle of the layer that computes ``module`` now, packing (again) when its
    parameters changed since; None: transformers' eager experts compute this call. Never traced
    by torch.compile (experts_forward calls it through torch.compiler.disable): it reads the
    parameters' storage and weak references that a graph cannot hold, and packs on first use."""
    import torch

    source = _source(module)
    packed, fallback = _packed.get(module), _fallbacks.get(module)
    if fallback is not None and fallback[1].matches(source):
        return None
    if packed is None or not packed.source.matches(source):
        with _lock:  # pack once, even when two threads call first
            packed = _repack(module, source, top_k)
        if packed is None:
            return None
    if hidden_states.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        if packed.released:
            raise RuntimeError(_released(module, f"{hidden_states.dtype} hidden states cannot run on the kernels"))
        return None  # transformers' experts take what the kernels do not
    return packed.handle


# made once (torch is loaded with torch_op already): wrapping it anew took ~40 us a call, a few
# percent of a decode step's layer
_eager_layer_for = torch.compiler.disable(_layer_for)


def _released(module: Any, why: str) -> str:
    return (
        f"ktforge: {why}, and {type(module).__name__}'s weights were released when ktforge packed them "
        "(configure(release_torch_weights=True)): load the model again without that setting"
    )


def _repack(module: Any, source: _Source, top_k: int) -> _Packed | None:
    """Packs ``module`` for its current parameters, or records why it falls back (None)."""
    packed = _packed.get(module)
    if packed is not None and packed.source.matches(source):
        return packed  # another thread packed it meanwhile
    if packed is None and getattr(module, "_ktforge_guarded", False) and module.gate_up_proj.numel() == 0:
        # a copy (deepcopy, pickle) of a module whose weights were released: nothing to pack from
        raise RuntimeError(_released_message(module, "a copy of it"))
    reason = why_unsupported(module)
    if packed is not None and packed.released:
        raise RuntimeError(_released(module, "its weights changed after packing" + (f" ({reason})" if reason else "")))
    if reason is None:
        return _install(module, _pack(module, top_k))
    if _fallbacks.get(module, ("",))[0] != reason:
        warnings.warn(f"ktforge: {type(module).__name__} runs transformers' eager experts: {reason}", stacklevel=4)
    _fallbacks[module] = (reason, source)
    if packed is not None:
        torch_op.unregister_layer(packed.handle)
        del _packed[module]
    return None


def experts_forward(module: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """transformers' experts interface: the routed experts of ``module`` on ktforge's kernels. Under
    torch.compile the layer lookup runs eagerly (a graph break) and the kernels are the traced
    custom op ``ktforge::moe``."""
    handle = _eager_layer_for(module, hidden_states, int(top_k_index.shape[-1]))
    if handle is None:
        return type(module).forward.__wrapped__(module, hidden_states, top_k_index, top_k_weights)
    return torch_op.moe(hidden_states, top_k_index, top_k_weights, handle)


def sweep() -> list[tuple[str, str, str | None]]:
    """Every experts class of transformers' models that uses the experts interface, built from
    its model type's default config on the meta device (no memory): (model type, class, why it
    falls back or None). In :mod:`ktforge.engines.transformers.coverage`."""
    from ktforge.engines.transformers import coverage

    return coverage.sweep()


def _register() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, experts_forward)


_register()
