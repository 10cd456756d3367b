"""What the layer does with weights as a checkpoint stores them: their scales checked, GPTQ's
act-order made the layer's, and the group at which a stored format keeps its scales."""

from __future__ import annotations

from typing import Any

import numpy as np

from ktforge import formats


def check_scales(method: str, name: str, parts: dict[str, np.ndarray[Any, Any]]) -> None:
    """A projection's scales (and zero points) checked, FP8 codes viewed as their bytes in place.
    int4's scales carry the sign of each group's largest value; a checkpoint's FP8 block of zeros
    (or an int4z group) may have any finite scale; an E8M0 code of 255 is NaN, a UE4M3 code of 127."""
    f = formats.by_name(method)
    element = f.element
    if f.super_block is not None:  # their records' d (and dmin): the extension checks them as float16
        return
    scale = parts["scale"].astype(np.float32)
    ok = np.isfinite(scale)
    if element == "fp4":
        ok &= parts["scale"] != 255
    elif element == "mxfp8":
        ok &= parts["scale"] <= 190  # past 2^63: beyond what fp8's kernels scale sums by (kernels/types.hpp)
    elif element == "nvfp4":
        ok &= parts["scale"] <= 0x7E
    elif element == "int4":
        ok &= scale != 0
    elif element not in ("fp8", "int4z", "int8h", "iq4nl", "q40", "q41", "q50", "q51"):
        ok &= scale > 0
    if not ok.all():
        wanted = {
            "int4": "nonzero and finite",
            "fp4": "E8M0 codes other than 255 (NaN)",
            "nvfp4": "UE4M3 codes up to 126 (127 is NaN; the sign bit is not theirs)",
            "fp8": "finite",
            "mxfp8": "E8M0 codes up to 190 (2^63; 255 is NaN)",
        }
        signed = ("int4z", "int8h", "iq4nl", "q40", "q41", "q50", "q51")  # any finite scale
        expected = wanted.get(element, "finite" if element in signed else "positive and finite")
        raise ValueError(f"{name}.scale holds values that are not {expected}")
    if "global_scale" in parts and not np.isfinite(parts["global_scale"]).all():
        raise ValueError(f"{name}.global_scale holds values that are not finite")
    if "zero" in parts and (parts["zero"] > 15).any():
        raise ValueError(f"{name}.zero holds zero points above 15")
    if element in ("fp8", "mxfp8"):
        parts["weight"] = parts["weight"].view(np.uint8)  # E4M3 codes as their bytes


def kernel_parts(method: str, group: int, name: str, q: Any, shape: tuple[int, int, int]) -> dict[str, Any]:
    """One projection's parts (``Quantized``, ``E, N, K``) checked against its format's portable
    layout, its scales checked, and each part as the extension takes it: 16-bit floats as their
    bits; a float projection's ``scale`` an empty placeholder (bf16: a mixed layer's)."""
    from ktforge.checkpoints.safetensors_io import DTYPES
    from ktforge.formats.quantize import Quantized, shapes

    if not isinstance(q, Quantized):
        raise TypeError(f"{name} must be a ktforge.formats.quantize.Quantized, got {type(q).__name__}")
    E, N, K = shape
    parts = {}
    for part, (dims, dtype) in shapes(method, N, K, group).items():
        expected = np.dtype(DTYPES[dtype])
        if getattr(q, part) is None:
            raise ValueError(f"{name}.{part} is missing; {method} needs {expected} {(E, *dims)}")
        array = np.asarray(getattr(q, part))
        if array.shape != (E, *dims) or array.dtype != expected:
            raise ValueError(
                f"{name}.{part} is {array.dtype} {tuple(array.shape)}; {method} with group size "
                f"{group} needs {expected} {(E, *dims)}"
            )
        parts[part] = np.ascontiguousarray(array)
    element = formats.by_name(method).element
    if element in ("bf16", "f16", "f32"):  # values only
        if not np.isfinite(parts["weight"]).all():
            raise ValueError(f"{name} contains NaN or infinite values")
        weight = parts["weight"] if element == "f32" else parts["weight"].view(np.uint16)
        return {"weight": weight, "scale": np.empty(0, np.uint8)}
    check_scales(method, name, parts)
    if parts["scale"].dtype.itemsize == 2:  # bfloat16 or float16 scales: their bits
        parts["scale"] = parts["scale"].view(np.uint16)
    return parts


def act_order(
    arrays: dict[str, np.ndarray[Any, Any]],
    orders: dict[tuple[int, str], np.ndarray[Any, Any]],
    experts: int,
    hidden: int,
) -> np.ndarray[Any, Any] | None:
    """GPTQ's act-order made the layer's, in place: down's input order permutes the rows of gate
    and up, so the intermediate activation comes out in it; gate's and up's (one order: they take
    the same input) is returned [E, H] for ``MoE.load_input_order``, or None if neither has one."""
    inputs = np.tile(np.arange(hidden, dtype=np.int32), (experts, 1))
    for e in range(experts):
        down = orders.get((e, "down"))
        if down is not None:
            for key in [k for k in arrays if k.startswith(("gate.", "up."))]:
                arrays[key][e] = arrays[key][e][down]
        gate, up = orders.get((e, "gate")), orders.get((e, "up"))
        if (gate is None) != (up is None) or (gate is not None and up is not None and not np.array_equal(gate, up)):
            raise ValueError(
                f"expert {e}: gate's and up's act-orders (g_idx) differ; ktforge takes one input order for both "
                "(they share their input); pass method= to re-quantize"
            )
        if gate is not None:
            inputs[e] = gate
    return inputs if any((e, "gate") in orders for e in range(experts)) else None


def stored_group(checkpoint: Any, method: str, stored: str | None) -> int:
    """The group size at which ``method`` keeps a checkpoint's own scales: FP8's blocks along K,
    packed INT4's (GPTQ's, AWQ's) groups; else 128 (or the format's first, for one without 128)."""
    sizes = formats.by_name(method).group_sizes
    if method == "fp8" and checkpoint.fp8_block[1] in sizes:
        return int(checkpoint.fp8_block[1])
    if method == stored and method in ("int4", "int4z") and checkpoint.packed_scheme is not None:
        return int(checkpoint.packed_group())  # compressed-tensors' groups, or its channel strategy's
    scheme = checkpoint.linear_scheme  # GPTQ's / AWQ's
    if method == stored and method in ("int4", "int4z") and scheme is not None and scheme.group:
        return int(scheme.group)
    return 128 if not sizes or 128 in sizes else sizes[0]
