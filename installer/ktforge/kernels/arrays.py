"""The arrays MoE takes from its callers: numpy views of numpy arrays and torch CPU tensors,
the dtypes and layouts the extension reads, and the values it refuses."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.cache
def bf16_dtype() -> Any:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def as_numpy(value: Any, name: str) -> np.ndarray[Any, Any]:
    """numpy view of an array or a torch CPU tensor (bfloat16 kept as bfloat16)."""
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        if value.device.type != "cpu":
            raise ValueError(f"{name} is on {value.device}; ktforge computes on the CPU: pass {name}.cpu()")
        tensor = value.detach()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            return np.asarray(tensor.view(torch.int16).numpy()).view(bf16_dtype())
        return np.asarray(tensor.numpy())
    raise TypeError(f"{name} must be a numpy array or a torch tensor, not {type(value).__name__}")


def kernel_view(array: np.ndarray[Any, Any], name: str, copy: bool) -> np.ndarray[Any, Any]:
    """float32 or bfloat16 (as uint16), C-contiguous."""
    bf16 = bf16_dtype()
    if array.dtype not in (np.float32, bf16):
        if not copy:
            raise ValueError(f"{name} has dtype {array.dtype}; expected float32 or bfloat16 (or pass copy=True)")
        array = array.astype(np.float32)
    if not array.flags.c_contiguous:
        if not copy:
            raise ValueError(f"{name} is not C-contiguous; pass a contiguous array (or copy=True)")
        array = np.ascontiguousarray(array)
    return array.view(np.uint16) if array.dtype == bf16 else array


F16_ROUNDS_TO_INF = 65520.0  # the least magnitude float16's round to nearest even makes infinite


def check_finite(array: np.ndarray[Any, Any], name: str, method: str = "") -> None:
    """NaN or infinity refused; for f16 also what float16's rounding would make infinite."""
    values = array.view(bf16_dtype()) if array.dtype == np.uint16 else array
    if not np.isfinite(values).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    if method == "f16" and (np.abs(values.astype(np.float32)) >= F16_ROUNDS_TO_INF).any():
        raise ValueError(f"{name} holds values beyond float16's range (method f16; |w| < 65520)")
