"""vLLM's kernels as its AVX2 build has them, on any host: vLLM loads ``_C_AVX2`` on a CPU without
AVX-512, and that build lacks the GPTQ linear kernel ``cpu_gemm_wna16``; here looking the op up
fails as it does there. Also hides AMX from vLLM, as on such a CPU."""

import runpy
from pathlib import Path

import torch._ops

_lookup = torch._ops._OpNamespace.__getattr__


def _without_avx512_ops(namespace: torch._ops._OpNamespace, name: str) -> object:
    if namespace.name == "_C" and name == "cpu_gemm_wna16":
        raise AttributeError(f"'_OpNamespace' '_C' object has no attribute '{name}'")
    return _lookup(namespace, name)


torch._ops._OpNamespace.__getattr__ = _without_avx512_ops
runpy.run_path(str(Path(__file__).parents[1] / "vllm_without_amx" / "sitecustomize.py"))
