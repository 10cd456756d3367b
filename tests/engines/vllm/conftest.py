"""The tiny checkpoints the vLLM tests serve, written once a session by the real tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engines.vllm.environment import drive
from tests.engines.vllm.runs import vllm_own
from tests.fp8_checkpoints import dequantized_copy, fp8_copy
from tests.gptq_awq_checkpoints import gptq_release


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-MoE in bf16, as transformers saves it."""
    directory = tmp_path_factory.mktemp("qwen3-moe-bf16")
    drive("model", str(directory))
    return str(directory)


@pytest.fixture(scope="session")
def fp8_model(model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same model as its fine-grained FP8 release (128 x 128 block scales, Qwen3-*-FP8's layout)."""
    directory = tmp_path_factory.mktemp("qwen3-moe-fp8")
    fp8_copy(Path(model), directory)
    return str(directory)


@pytest.fixture(scope="session")
def fp8_dequantized(fp8_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The FP8 release dequantized to bf16 by its own definition: what vLLM's bf16 path runs."""
    directory = tmp_path_factory.mktemp("qwen3-moe-fp8-dequantized")
    dequantized_copy(Path(fp8_model), directory)
    return str(directory)


@pytest.fixture(scope="session")
def bf16_reference(model: str) -> dict[str, Any]:
    """The bf16 model on vLLM's own kernels, eager."""
    return vllm_own(model, enforce_eager=True)


@pytest.fixture(scope="session")
def fp8_reference(fp8_dequantized: str) -> dict[str, Any]:
    """The FP8 release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(fp8_dequantized, enforce_eager=True)


@pytest.fixture(scope="session")
def gptq_models(model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same model as a GPTQ release (4-bit, sym, groups of 128: attention and experts packed by
    AutoGPTQ), and that release in bf16 by AutoGPTQ's own dequantization."""
    released, dequantized = tmp_path_factory.mktemp("qwen3-moe-gptq"), tmp_path_factory.mktemp("qwen3-moe-gptq-bf16")
    gptq_release(Path(model), released, dequantized)
    return str(released), str(dequantized)


@pytest.fixture(scope="session")
def gptq_reference(gptq_models: tuple[str, str]) -> dict[str, Any]:
    """The GPTQ release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(gptq_models[1], enforce_eager=True)
