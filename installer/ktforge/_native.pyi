# Type stubs of the compiled extension (native/src/module.cpp).
from typing import Any

import numpy as np

def build_info() -> dict[str, Any]: ...
def cpu_has(feature: str) -> bool: ...
def disabled_cpu_features() -> list[str]: ...
def cpu_feature_disabled(feature: str) -> bool: ...
def request_amx_permission() -> int: ...
def blis_gemm_selftest() -> bool: ...
def use_blis_library(path: str) -> None: ...
def measure_peak(backend: str, kind: str, threads: int, iterations: int) -> float: ...
def measure_read_bandwidth(backend: str, threads: int, bytes: int, repeats: int) -> float: ...
def measure_node_read_bandwidth(backend: str, cpus: list[int], memory_node: int, bytes: int, repeats: int) -> float: ...
def thread_pool_selftest(threads: int, tasks: int) -> tuple[list[int], list[int]]: ...

class MoELayer:
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        method: str,
        group_size: int,
        backend: str,
        threads: int,
        swiglu_alpha: float = 1.0,
        swiglu_limit: float = ...,
        up_offset: float = 0.0,
        down_method: str = "",
        down_group_size: int = 128,
        numa_shares: list[tuple[list[int], int]] = ...,
    ) -> None: ...
    def load_biases(
        self,
        gate: np.ndarray[Any, Any] | None,
        up: np.ndarray[Any, Any] | None,
        down: np.ndarray[Any, Any] | None,
    ) -> None: ...
    def load_weights(
        self, gate: np.ndarray[Any, Any], up: np.ndarray[Any, Any], down: np.ndarray[Any, Any]
    ) -> None: ...
    def load_input_order(self, order: np.ndarray[Any, Any] | None) -> None: ...
    def set_token_scales(self, on: bool) -> None: ...
    def load_quantized(
        self,
        gate: np.ndarray[Any, Any],
        gate_scale: np.ndarray[Any, Any],
        up: np.ndarray[Any, Any],
        up_scale: np.ndarray[Any, Any],
        down: np.ndarray[Any, Any],
        down_scale: np.ndarray[Any, Any],
        gate_zero: np.ndarray[Any, Any] | None = None,
        up_zero: np.ndarray[Any, Any] | None = None,
        down_zero: np.ndarray[Any, Any] | None = None,
        gate_global: np.ndarray[Any, Any] | None = None,
        up_global: np.ndarray[Any, Any] | None = None,
        down_global: np.ndarray[Any, Any] | None = None,
    ) -> None: ...
    def forward(
        self,
        x: np.ndarray[Any, Any],
        ids: np.ndarray[Any, Any],
        weights: np.ndarray[Any, Any],
        out: np.ndarray[Any, Any],
        skip_absent: bool = False,
    ) -> None: ...
    def info(self) -> dict[str, Any]: ...
    def gate_up_task_counts(self) -> list[int]: ...
    def last_profile(self) -> dict[str, float]: ...

def quantize_weights(
    weights: np.ndarray[Any, Any],
    method: str,
    group_size: int,
    fp8_scale: np.ndarray[Any, Any] | None = None,
    block_rows: int = 128,
    block_cols: int = 128,
) -> tuple[np.ndarray[Any, Any], ...]: ...  # nvfp4: codes, scale codes and each row's tensor scale
def dequantize_fp8(
    weights: np.ndarray[Any, Any], scale: np.ndarray[Any, Any], block_rows: int, block_cols: int
) -> np.ndarray[Any, Any]: ...
