"""The tiny checkpoints the vLLM tests serve, written once a session by the real tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engines.vllm.environment import drive
from tests.engines.vllm.runs import WITHOUT_AMX, vllm_own
from tests.fp8_checkpoints import ct_fp8_release, dequantized_copy, fp8_copy
from tests.gptq_awq_checkpoints import gptq_awq_release
from tests.int4_checkpoints import int4_release
from tests.mxfp4_checkpoints import gpt_oss_dequantized, gpt_oss_release


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
def ct_fp8_models(model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same model as llm-compressor's FP8_DYNAMIC release (compressed-tensors' float-quantized,
    a scale per channel: attention and experts), and that release with its experts in bf16 by the
    library's own decompression."""
    released, dequantized = (
        tmp_path_factory.mktemp("qwen3-moe-ct-fp8"),
        tmp_path_factory.mktemp("qwen3-moe-ct-fp8-bf16"),
    )
    ct_fp8_release(Path(model), released, dequantized)
    return str(released), str(dequantized)


@pytest.fixture(scope="session")
def ct_fp8_references(ct_fp8_models: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compressed-tensors FP8 release, its experts' values in bf16, on vLLM's own kernels (its
    attention on vLLM's W8A8 FP8 kernel, as in the release, without AMX), eager and compiled:
    vLLM's compilation alone moves this model by more than FP8 moved the bf16 model (its fused
    norm and FP8 quantization), so a compiled run is held to the compiled reference."""
    return (
        vllm_own(ct_fp8_models[1], WITHOUT_AMX, enforce_eager=True),
        vllm_own(ct_fp8_models[1], WITHOUT_AMX),
    )


@pytest.fixture(scope="session")
def bf16_reference(model: str) -> dict[str, Any]:
    """The bf16 model on vLLM's own kernels, eager."""
    return vllm_own(model, enforce_eager=True)


@pytest.fixture(scope="session")
def bf16_compiled_reference(model: str) -> dict[str, Any]:
    """The bf16 model on vLLM's own kernels, compiled (vLLM's default)."""
    return vllm_own(model)


@pytest.fixture(scope="session")
def fp8_reference(fp8_dequantized: str) -> dict[str, Any]:
    """The FP8 release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(fp8_dequantized, enforce_eager=True)


@pytest.fixture(scope="session")
def gptq_models(model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same model as a GPTQ release (4-bit, sym, groups of 128: attention and experts packed by
    AutoGPTQ), and that release in bf16 by AutoGPTQ's own dequantization."""
    released, dequantized = tmp_path_factory.mktemp("qwen3-moe-gptq"), tmp_path_factory.mktemp("qwen3-moe-gptq-bf16")
    gptq_awq_release(Path(model), released, dequantized, "gptq")
    return str(released), str(dequantized)


@pytest.fixture(scope="session")
def gptq_reference(gptq_models: tuple[str, str]) -> dict[str, Any]:
    """The GPTQ release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(gptq_models[1], enforce_eager=True)


@pytest.fixture(scope="session")
def awq_models(model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same model as an AWQ release (4-bit with zero points, groups of 128, AutoAWQ's GEMM
    layout: attention and experts), and that release in bf16 by AutoAWQ's own dequantization."""
    released, dequantized = tmp_path_factory.mktemp("qwen3-moe-awq"), tmp_path_factory.mktemp("qwen3-moe-awq-bf16")
    gptq_awq_release(Path(model), released, dequantized, "awq")
    return str(released), str(dequantized)


@pytest.fixture(scope="session")
def awq_reference(awq_models: tuple[str, str]) -> dict[str, Any]:
    """The AWQ release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(awq_models[1], enforce_eager=True)


@pytest.fixture(scope="session", params=[False, True], ids=["asymmetric", "symmetric"])
def int4_models(
    request: pytest.FixtureRequest, model: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, str]:
    """The same model as a compressed-tensors W4A16 release of its experts (groups of 128, with or
    without zero points), and that release in bf16 by the library's own dequantization."""
    kind = "symmetric" if request.param else "asymmetric"
    released = tmp_path_factory.mktemp(f"qwen3-moe-w4a16-{kind}")
    dequantized = tmp_path_factory.mktemp(f"qwen3-moe-w4a16-{kind}-bf16")
    int4_release(Path(model), released, dequantized, group=128, symmetric=request.param)
    return str(released), str(dequantized)


@pytest.fixture(scope="session")
def int4_reference(int4_models: tuple[str, str]) -> dict[str, Any]:
    """The W4A16 release's values in bf16 on vLLM's own kernels, eager: runs on every host."""
    return vllm_own(int4_models[1], enforce_eager=True)


@pytest.fixture(scope="session")
def int4_compiled_reference(int4_models: tuple[str, str]) -> dict[str, Any]:
    """The same, compiled (vLLM's default), for the compiled runs."""
    return vllm_own(int4_models[1])


@pytest.fixture(scope="session")
def gpt_oss_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """A tiny gpt-oss saved by transformers in bf16, its MXFP4 release as OpenAI ships gpt-oss
    (fused blocks and scales, biases, ``quant_method: mxfp4``), and that release in bf16 by
    transformers' own dequantization."""
    original = tmp_path_factory.mktemp("gpt-oss-bf16")
    drive("gpt_oss", str(original))
    released, dequantized = tmp_path_factory.mktemp("gpt-oss-mxfp4"), tmp_path_factory.mktemp("gpt-oss-dequantized")
    gpt_oss_release(original, released)
    gpt_oss_dequantized(released, dequantized)
    return str(original), str(released), str(dequantized)


@pytest.fixture(scope="session")
def gpt_oss_reference(gpt_oss_models: tuple[str, str, str]) -> dict[str, Any]:
    """The MXFP4 release's values in bf16 on vLLM's own kernels, eager."""
    return vllm_own(gpt_oss_models[2], enforce_eager=True)


@pytest.fixture(scope="session")
def gpt_oss_bf16_reference(gpt_oss_models: tuple[str, str, str]) -> dict[str, Any]:
    """The model before MXFP4, on vLLM's own kernels, eager."""
    return vllm_own(gpt_oss_models[0], enforce_eager=True)


@pytest.fixture(scope="session")
def gpt_oss_compiled_reference(gpt_oss_models: tuple[str, str, str]) -> dict[str, Any]:
    """The MXFP4 release's values in bf16 on vLLM's own kernels, compiled (vLLM's default)."""
    return vllm_own(gpt_oss_models[2])
