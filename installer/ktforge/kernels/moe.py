"""``ktforge.MoE``: one MoE layer's routed experts on the CPU, with validated inputs.

Arrays are numpy (float32, or bfloat16 from ml_dtypes) or torch CPU tensors. Contiguous
inputs of a supported dtype are passed to the kernels without a copy; anything else is
refused with a message rather than silently copied, unless ``copy=True`` is given.

Behaviour at the edges, by design:
- ``forward`` with T = 0 returns an empty ``[0, H]`` array.
- Non-finite values (NaN, inf) in the weights given to ``load_weights``, or in ``x`` or the
  routing weights given to ``forward``, raise ``ValueError``: quantization scales and
  accumulations would silently turn them into garbage.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ktforge import formats
from ktforge.builder import backends as backends_table
from ktforge.checkpoints.safetensors_io import DTYPES as _SAFETENSORS_NUMPY
from ktforge.formats.quantize import METHODS, Quantized
from ktforge.kernels import numa as numa_shares
from ktforge.kernels.guard import import_guard
from ktforge.kernels.memory import check_layer_fits
from ktforge.kernels.numa import NumaSpec

if TYPE_CHECKING:
    from ktforge.checkpoints.gguf import Routing
from ktforge.kernels import ACTIVATIONS, MAX_THREADS
from ktforge.kernels import stored as stored_formats
from ktforge.kernels.arrays import as_numpy, bf16_dtype, check_finite, kernel_view

# the kernel backends, then those that hand some methods to a library (amd-blis: AOCL)
BACKENDS = ("auto", *backends_table.names(), *(lib.name for lib in backends_table.libraries()))
_SELECTED_BACKEND = import_guard()


_LIBRARY_BACKENDS = {lib.name for lib in backends_table.libraries()}


def _find_blis_library() -> str | None:
    """For a library backend in a build that links no AOCL (a portable wheel) and without
    KTFORGE_BLIS_LIBRARY: the first BLIS library on this machine with the aocl_gemm entry points
    (the aoclda wheel's, /opt/AMD/aocl, ...); the layer then checks its GEMMs on known answers.
    None: nothing found (the layer says how to get one)."""
    import ktforge._native as _native

    if os.environ.get("KTFORGE_BLIS_LIBRARY") or _native.build_info().get("blis"):
        return None
    return _discover_blis_library()


@functools.cache  # the machine's libraries, searched once; the variable above is read every time
def _discover_blis_library() -> str | None:
    import ktforge._native as _native
    from ktforge.detect import blis

    for path in blis.find_candidates(blis.search_dirs()):
        try:
            _native.use_blis_library(path)
        except ValueError:
            continue  # upstream BLIS without the add-on, or not loadable
        return path
    return None


def _check_gating(swiglu_alpha: float, swiglu_limit: float | None, up_offset: float) -> None:
    for label, number, ok in (
        ("swiglu_alpha", swiglu_alpha, "positive"),
        ("swiglu_limit", 1.0 if swiglu_limit is None else swiglu_limit, "positive (or None)"),
        ("up_offset", up_offset, "finite"),
    ):
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ValueError(f"{label} must be a finite number, got {number!r}")
        if ok != "finite" and number <= 0:
            raise ValueError(f"{label} must be {ok}, got {number!r}")


def _check_activations(activations: str) -> None:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")


class MoE:
    """Routed experts of one MoE layer.

    Args:
        num_experts, top_k, hidden_size, intermediate_size: the layer's shape (E, k, H, I).
        method: "bf16", "int8" (per-output-channel weights, activations per 128 values of K), "int8g"
            (int8 with a scale per group of ``group_size`` weights, 32, 64 or 128: group 32 is
            llama.cpp's Q8_0), "int4" (group-wise weights, ``group_size`` 32, 64 or 128) or
            "fp8" (FP8 E4M3 with a float32 scale per 16 rows and ``group_size`` values of K, or a
            checkpoint's own 128 x 128 block, channel or tensor scales; fp32 activations) or
            "mxfp4" (OCP MXFP4: E2M1 values with a power-of-two E8M0 scale per 32, gpt-oss's;
            ``group_size`` 32), or any other of ktforge.formats.names(). ``group_size``: None takes
            128 where the format takes it, else the format's own group (mxfp4's and q4_k's 32).
        backend: "auto" (the best this CPU runs), "amx" (tiles for prefill, AVX-512 for decode),
            "avx512", "avx2", "reference", "amx-model" (the AMX kernels on a software tile
            unit: slow, for verification on CPUs without AMX), or "amd-blis":
            AOCL-BLAS's aocl_gemm for int8/bf16 experts with enough tokens (the threshold is
            measured at load against ktforge's kernels and shown in .info), ktforge's kernels
            otherwise and for the grouped formats. Uses the library an amd-blis build linked, else
            KTFORGE_BLIS_LIBRARY, else the first AOCL-BLAS with the add-on found on this machine.
        threads: worker threads (default: the CPUs this process may use).
        swiglu_alpha, swiglu_limit, up_offset: the gated activation,
            ``(clamp(up, -limit, limit) + up_offset) * g * sigmoid(alpha * g)`` with
            ``g = min(gate, limit)``: SwiGLU by default (alpha 1, no limit, offset 0); DeepSeek-V4
            clamps (``swiglu_limit``); gpt-oss is ``swiglu_alpha=1.702, swiglu_limit=7.0,
            up_offset=1.0``, with biases (:meth:`load_biases`).
        down_method, down_group_size: down's own format, where a checkpoint stores it in another
            than gate and up (a GGUF's Q4_K gate/up with a Q8_0 down); None: the layer's.
        activations: how the formats with int8 activations quantize each projection's input:
            "per-block" (a scale per block of K, ``info["activations"]`` says which: as fine as
            llama.cpp's or finer) or "per-token" (one scale a token: less accurate where a few
            channels are large, and the group-32 formats' and per-row int8's prefill about 8%
            faster on AVX-512; docs/kernels.md, "Activations").
        numa: "auto" (one worker pool a NUMA node with CPUs this process may use, where there
            are two or more, each node's columns of every expert in its own memory; else one
            pool), "off" (one pool), a list of node ids, or a list of
            :class:`ktforge.NumaShare` (CPUs and a memory node each). Results are the same to
            the bit whatever the split (docs/numa.md).
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        method: str = "bf16",
        backend: str = "auto",
        threads: int | None = None,
        group_size: int | None = None,
        swiglu_alpha: float = 1.0,
        swiglu_limit: float | None = None,
        up_offset: float = 0.0,
        down_method: str | None = None,
        down_group_size: int | None = None,
        activations: str = "per-block",
        numa: NumaSpec = "auto",
    ) -> None:
        import ktforge._native as _native

        for label, value in (
            ("num_experts", num_experts),
            ("top_k", top_k),
            ("hidden_size", hidden_size),
            ("intermediate_size", intermediate_size),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
            if value >= 2**31:  # the kernels index with 32-bit integers
                raise ValueError(f"{label} must be below 2^31, got {value}")
        if top_k > num_experts:
            raise ValueError(f"top_k ({top_k}) cannot exceed num_experts ({num_experts})")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if down_method not in (None, *METHODS):
            raise ValueError(f"down_method must be one of {', '.join(METHODS)}, got {down_method!r}")
        down_group = down_group_size or group_size or formats.default_group(down_method or method)
        group_size = formats.default_group(method) if group_size is None else group_size
        formats.check_group(method, group_size)
        formats.check_group(down_method or method, down_group, "down_group_size")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        if threads is not None and threads > MAX_THREADS:
            raise ValueError(f"threads must be at most {MAX_THREADS}, got {threads}")
        _check_gating(swiglu_alpha, swiglu_limit, up_offset)
        check_layer_fits(
            num_experts, hidden_size, intermediate_size, (method, group_size), (down_method or method, down_group)
        )
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.hidden_size, self.intermediate_size = int(hidden_size), int(intermediate_size)
        self.method, self._group = method, int(group_size)
        self.down_method, self._down_group = down_method or method, int(down_group)
        backend = _SELECTED_BACKEND if backend == "auto" and _SELECTED_BACKEND else backend
        if backend in _LIBRARY_BACKENDS:
            _find_blis_library()
        self.numa = numa_shares.resolve(numa, threads)
        self._layer = _native.MoELayer(
            self.num_experts,
            self.top_k,
            self.hidden_size,
            self.intermediate_size,
            method,
            group_size,
            backend,
            threads or 0,
            float(swiglu_alpha),
            math.inf if swiglu_limit is None else float(swiglu_limit),
            float(up_offset),
            self.down_method,  # with its own group, where only the group differs (a rank's GPTQ act-order)
            int(down_group),
            [(list(share.cpus), share.node) for share in self.numa],
        )
        self._loaded = False
        self._set_activations(activations)
        self.routing: Routing | None = None  # a GGUF's (MoE.from_pretrained): ids and weights from router logits

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        layer: int,
        *,
        method: str | None = None,
        backend: str = "auto",
        threads: int | None = None,
        numa: NumaSpec = "auto",
        group_size: int | None = None,
        input_type: str = "auto",
        verify: bool = True,
        activation: dict[str, Any] | None = None,
        activations: str = "per-block",
    ) -> MoE:
        """One MoE layer's routed experts from disk, ready to run.

        ``path`` is a ``kt convert`` output (its method and group; checksums verified unless
        ``verify=False``), a GGUF (a file, split parts or their directory: each tensor served in
        the format that holds its values, the routing in ``.routing``), or a Hugging Face
        checkpoint (Qwen3-MoE, DeepSeek-V3, Mixtral; bf16/fp16/fp32, FP8, INT4, MXFP4, GPTQ,
        AWQ), quantized here for ``method`` exactly as ``kt convert`` would. Without ``method``,
        stored formats are served as they are (their codes and scales repacked, not re-quantized;
        what no format holds exactly raises ValueError saying so), others as bf16. ``layer`` is
        the model's layer index. ``activation``: the gated activation (``swiglu_alpha``,
        ``swiglu_limit``, ``up_offset``, as for the constructor), SwiGLU by default.
        ``activations``: "per-block" or "per-token", and ``numa``, as for the constructor: a file
        does not depend on the node count, the split happens here.
        """
        from ktforge.checkpoints import convert, gguf

        _check_activations(activations)
        directory = Path(path)
        gating = activation or {}
        if gguf.is_gguf(directory):
            moe = cls._from_gguf(directory, layer, method, backend, threads, numa, group_size, gating)
        elif (directory / convert.MANIFEST).is_file() or (directory / convert.STATE).is_file():
            moe = cls._from_conversion(directory, layer, method, backend, threads, numa, group_size, verify, gating)
        else:
            moe = cls._from_checkpoint(directory, layer, method, backend, threads, numa, group_size, input_type, gating)
        moe._set_activations(activations)
        return moe

    def _set_activations(self, activations: str) -> None:
        _check_activations(activations)
        int8 = [m for m in (self.method, self.down_method) if formats.by_name(m).activation_block is not None]
        if activations == "per-token" and not int8:
            raise ValueError(f"activations='per-token' is for int8 activations; method {self.method!r} takes floats")
        self._layer.set_token_scales(activations == "per-token")
        self.activations = activations

    @classmethod
    def _from_gguf(
        cls,
        path: Path,
        layer: int,
        method: str | None,
        backend: str,
        threads: int | None,
        numa: NumaSpec,
        group_size: int | None,
        activation: dict[str, Any],
    ) -> MoE:
        """A GGUF's layer in the file's values; its routing (the file's metadata) in ``.routing``."""
        from ktforge.checkpoints.gguf import GgufCheckpoint

        with GgufCheckpoint(path) as checkpoint:
            served = checkpoint.stored_formats(layer)  # checks the layer's tensors once
            (stored, group), (down_stored, down_group) = served["gate"], served["down"]
            if method not in (None, stored) or group_size not in (None, group):
                raise ValueError(f"{path}: layer {layer}'s experts are served as {stored}, in the file's values")
            moe = cls(
                checkpoint.experts,
                checkpoint.top_k,
                checkpoint.hidden,
                checkpoint.intermediate,
                method=stored,
                backend=backend,
                threads=threads,
                numa=numa,
                group_size=group,
                **(activation or checkpoint.activation()),
                down_method=down_stored,
                down_group_size=down_group,
            )
            moe.load_quantized(*(checkpoint.quantized(layer, p) for p in ("gate", "up", "down")))
            biases = checkpoint.biases(layer)
            if biases is not None:
                moe.load_biases(*biases)
            moe.routing = checkpoint.routing
        return moe

    @classmethod
    def _from_conversion(
        cls,
        directory: Path,
        layer: int,
        method: str | None,
        backend: str,
        threads: int | None,
        numa: NumaSpec,
        group_size: int | None,
        verify: bool,
        activation: dict[str, Any],
    ) -> MoE:
        from ktforge.checkpoints import convert

        manifest, projections, biases = convert.load_layer(directory, layer, verify)
        stored_group = manifest.get("group_size") or 128
        if method is not None and method != manifest["method"]:
            raise ValueError(
                f"{directory} was converted for {manifest['method']}, not {method}; convert again with "
                f"--quant {method}, or load the original checkpoint"
            )
        if group_size is not None and formats.by_name(manifest["method"]).grouped and group_size != stored_group:
            raise ValueError(f"{directory} was converted with group size {stored_group}, not {group_size}")
        moe = cls(
            manifest["num_experts"],
            manifest["top_k"],
            manifest["hidden_size"],
            manifest["intermediate_size"],
            method=manifest["method"],
            backend=backend,
            threads=threads,
            numa=numa,
            group_size=stored_group,
            **(activation or manifest.get("activation") or {}),
        )
        moe.load_quantized(projections["gate"], projections["up"], projections["down"])
        if biases is not None:
            moe.load_biases(*biases)
        return moe

    @classmethod
    def _from_checkpoint(
        cls,
        directory: Path,
        layer: int,
        method: str | None,
        backend: str,
        threads: int | None,
        numa: NumaSpec,
        group_size: int | None,
        input_type: str,
        activation: dict[str, Any],
    ) -> MoE:
        """A Hugging Face checkpoint's layer, quantized here exactly as ``kt convert`` would, or,
        with no method given, FP8 and INT4 experts as they are stored (else bf16)."""
        from contextlib import closing

        from ktforge.checkpoints import convert
        from ktforge.checkpoints.checkpoint import Checkpoint

        with Checkpoint(directory, input_type) as checkpoint:
            if layer not in checkpoint.moe_layers:
                raise ValueError(
                    f"{directory}: layer {layer} holds no routed experts; MoE layers are "
                    f"{convert.format_layers(checkpoint.moe_layers)}"
                )
            stored = checkpoint.stored_method(layer)
            method = method or stored or "bf16"
            group = group_size or stored_formats.stored_group(checkpoint, method, stored)
            activation = activation or checkpoint.activation()  # gpt-oss's, from its architecture
            moe = cls(
                checkpoint.experts,
                checkpoint.top_k,
                checkpoint.hidden,
                checkpoint.intermediate,
                method=method,
                backend=backend,
                threads=threads,
                numa=numa,
                group_size=group,
                **activation,
            )
            exact = method == stored and group_size is None  # the file's values, or an error saying why not
            options = convert.Options(method, group if formats.by_name(method).grouped else 0, input_type, exact)
            tensors = convert.layer_tensors(
                method, checkpoint.experts, checkpoint.hidden, checkpoint.intermediate, options.group_size
            )
            arrays = {name: np.empty(shape, _SAFETENSORS_NUMPY[dtype]) for name, (dtype, shape) in tensors.items()}

            orders: dict[tuple[int, str], np.ndarray[Any, Any]] = {}  # GPTQ act-order

            def store(expert: int, projection: str, q: Quantized) -> None:
                for part, array in q.parts().items():
                    arrays[f"{projection}.{part}"][expert] = array
                if q.order is not None:
                    orders[expert, projection] = q.order

            workers = threads or len(os.sched_getaffinity(0))
            with closing(convert.quantized_experts(checkpoint, layer, options, workers, store)) as experts:
                for _ in experts:
                    pass
            biases = checkpoint.biases(layer)
        input_order = (
            stored_formats.act_order(arrays, orders, checkpoint.experts, checkpoint.hidden) if orders else None
        )
        moe.load_quantized(*(Quantized.named(arrays, p) for p in ("gate", "up", "down")))
        if biases is not None:
            moe.load_biases(*biases)
        if input_order is not None:
            moe.load_input_order(input_order)
        return moe

    @property
    def info(self) -> dict[str, Any]:
        """Which backend, kernel and ISA run, threads, packed weight bytes, NUMA shares."""
        info = dict(self._layer.info())
        for share, facts in zip(self.numa, info["numa_shares"], strict=True):
            facts["cpus"] = list(share.cpus)
        return info

    def load_weights(self, gate: Any, up: Any, down: Any, *, copy: bool = False) -> None:
        """gate, up: [E, I, H]; down: [E, H, I]; float32 or bfloat16, all the same dtype."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        arrays = {}
        for name, value, shape in (("gate", gate, (E, I, H)), ("up", up, (E, I, H)), ("down", down, (E, H, I))):
            array = as_numpy(value, name)
            if array.shape != shape:
                axes = "E, H, I" if name == "down" else "E, I, H"
                raise ValueError(f"{name} has shape {tuple(array.shape)}; expected {shape} ({axes})")
            arrays[name] = kernel_view(array, name, copy)
        if len({a.dtype for a in arrays.values()}) != 1:
            raise ValueError("gate, up and down must have the same dtype")
        for name, array in arrays.items():
            check_finite(array, name, self.down_method if name == "down" else self.method)
        self._layer.load_weights(arrays["gate"], arrays["up"], arrays["down"])
        self._loaded = True

    def load_input_order(self, order: Any = None) -> None:
        """Each expert's gate and up take the layer's input in its own order: ``order`` ``[E, H]``
        integers, row e a permutation of range(H), expert e's input j being x[order[e, j]] (GPTQ's
        act-order, its groups made contiguous); None restores the input's own order."""
        E, H = self.num_experts, self.hidden_size
        if order is None:
            self._layer.load_input_order(None)
            return
        array = as_numpy(order, "order")
        if array.shape != (E, H) or array.dtype.kind not in "iu":
            raise ValueError(f"order must be integers of shape {(E, H)}, got {array.dtype} {tuple(array.shape)}")
        rows = np.sort(array, axis=1)
        if not (rows == np.arange(H)).all():
            bad = int(np.nonzero(~(rows == np.arange(H)).all(axis=1))[0][0])
            raise ValueError(f"order[{bad}] is not a permutation of range({H})")
        self._layer.load_input_order(np.ascontiguousarray(array, dtype=np.int32))

    def load_biases(self, gate: Any = None, up: Any = None, down: Any = None) -> None:
        """Per-expert biases (gpt-oss): gate, up ``[E, I]`` and down ``[E, H]``, any real dtype
        (kept as float32, whatever the weights' format); None for none. ``y[t] = sum_j w[t, j] *
        (down_e(act(gate_e x + gate_bias_e, up_e x + up_bias_e)) + down_bias_e)``. Replaces biases
        loaded before; ``load_biases()`` removes them."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        arrays: list[np.ndarray[Any, Any] | None] = []
        for name, value, shape in (("gate", gate, (E, I)), ("up", up, (E, I)), ("down", down, (E, H))):
            if value is None:
                arrays.append(None)
                continue
            array = as_numpy(value, f"{name}_bias")
            if array.shape != shape:
                raise ValueError(f"{name}_bias has shape {tuple(array.shape)}; expected {shape}")
            if array.dtype.kind not in "fiu" and array.dtype != bf16_dtype():
                raise ValueError(f"{name}_bias must be real numbers, got {array.dtype}")
            array = np.ascontiguousarray(array, dtype=np.float32)
            check_finite(array, f"{name}_bias")
            arrays.append(array)
        self._layer.load_biases(*arrays)

    def load_quantized(self, gate: Quantized, up: Quantized, down: Quantized) -> None:
        """Weights already quantized for this layer's method, in the portable layout of
        :mod:`ktforge.formats.quantize` (what ``kt convert`` writes): gate, up ``[E, I, ...]``, down
        ``[E, H, ...]``. Gives exactly the results of ``load_weights`` on the float weights."""
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        parts = {
            name: stored_formats.kernel_parts(
                self.down_method if name == "down" else self.method,
                self._down_group if name == "down" else self._group,
                name,
                q,
                (E, N, K),
            )
            for name, q, (N, K) in (("gate", gate, (I, H)), ("up", up, (I, H)), ("down", down, (H, I)))
        }
        if self.method == self.down_method == "bf16":
            self.load_weights(*(parts[p]["weight"].view(bf16_dtype()) for p in parts))
            return
        extra = {f"{p}_zero": parts[p]["zero"] for p in parts if "zero" in parts[p]}
        extra.update({f"{p}_global": parts[p]["global_scale"] for p in parts if "global_scale" in parts[p]})
        self._layer.load_quantized(
            *(array for p in parts for array in (parts[p]["weight"], parts[p]["scale"])), **extra
        )
        self._loaded = True

    def forward(self, x: Any, ids: Any, weights: Any, *, copy: bool = False, skip_absent: bool = False) -> Any:
        """x: [T, H]; ids: [T, k] integer expert ids in [0, E); weights: [T, k].

        ``skip_absent``: an id of -1 is an expert this layer does not hold (another process's,
        under expert parallelism: vLLM's ``expert_map``) and adds nothing; without it, -1 is
        refused like any id outside [0, E).
        Returns [T, H] in x's dtype (float32 or bfloat16), as a torch tensor if x was one.
        """
        if not self._loaded:
            raise RuntimeError("forward() called before load_weights()")
        is_torch = type(x).__module__.startswith("torch")
        x_np = as_numpy(x, "x")
        if x_np.ndim != 2 or x_np.shape[1] != self.hidden_size:
            raise ValueError(f"x has shape {tuple(x_np.shape)}; expected (T, {self.hidden_size})")
        T = x_np.shape[0]
        ids_np = as_numpy(ids, "ids")
        weights_np = as_numpy(weights, "weights")
        for name, array in (("ids", ids_np), ("weights", weights_np)):
            if array.shape != (T, self.top_k):
                raise ValueError(f"{name} has shape {tuple(array.shape)}; expected ({T}, {self.top_k})")
        if ids_np.dtype.kind not in "iu":
            raise ValueError(f"ids must be integers, got {ids_np.dtype}")
        # real numbers only: a complex weight would lose its imaginary part in the cast below
        if weights_np.dtype.kind not in "fiu" and weights_np.dtype != bf16_dtype():
            raise ValueError(f"weights must be real numbers (float32 or bfloat16), got {weights_np.dtype}")
        x_kernel = kernel_view(x_np, "x", copy)
        bf16 = x_np.dtype == bf16_dtype()
        out = np.empty((T, self.hidden_size), dtype=x_np.dtype if bf16 else np.float32)
        if T > 0:
            if ids_np.dtype == np.uint64 and ids_np.max() >= self.num_experts:  # would wrap in int64
                raise ValueError(f"expert id {int(ids_np.max())} is outside [0, {self.num_experts})")
            ids64 = np.ascontiguousarray(ids_np, dtype=np.int64)
            w32 = np.ascontiguousarray(weights_np, dtype=np.float32)
            # an expert id outside [0, E), NaN/inf in x or the weights: the kernels find them
            # (routing, quantizing) before touching memory, and raise ValueError
            self._layer.forward(x_kernel, ids64, w32, out.view(np.uint16) if bf16 else out, bool(skip_absent))
        if is_torch:
            import torch

            if out.dtype == bf16_dtype():
                return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(out)
        return out

    __call__ = forward


def build_info() -> dict[str, Any]:
    """What the installed extension was built with: compiler, flags, backends and their CPU needs
    (from the extension itself), under "record" the build record written beside it, and under
    "selection" the level backend='auto' runs here and why each better compiled one does not
    (KTFORGE_BACKEND, when set, overrides it)."""
    import ktforge._native as _native
    from ktforge.builder.build_record import installed_record

    info = dict(_native.build_info())
    choice = backends_table.select(
        [(b["name"], b["required_cpu_features"]) for b in info["backends"]],
        _native.cpu_has,
        lambda: _native.request_amx_permission() == 0,
    )
    selection = {
        "auto": choice.name,
        "why_not": choice.why_not,
        "override": _SELECTED_BACKEND,
        "disabled_cpu_features": _native.disabled_cpu_features(),
    }
    return {**info, "record": installed_record(), "selection": selection}
