"""GGUF's i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S) held to llama.cpp's own definitions: the
grids as gguf-py (llama.cpp's Python package) states them, the blocks ktforge's quantizer writes as
gguf-py dequantizes them, and that quantizer's error beside llama.cpp's own quantizer's on the same
weights (tests/fixtures/gguf: llama-quantize with an importance matrix from llama-imatrix). The
kernels over these values: test_moe_correctness and the other per-format tests, and, on llama.cpp's
own files, tests/checkpoints/test_gguf_checkpoints.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import ktforge
from ktforge.formats import lattice
from ktforge.formats.lattice_values import LATTICE_BLOCK_BYTES
from ktforge.formats.quantize import dequantize, quantize

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
# format -> its ggml type, and the group its scales cover
TYPES = {
    "iq2_xxs": (gguf.GGMLQuantizationType.IQ2_XXS, 32),
    "iq2_xs": (gguf.GGMLQuantizationType.IQ2_XS, 16),
    "iq3_xxs": (gguf.GGMLQuantizationType.IQ3_XXS, 32),
    "iq1_s": (gguf.GGMLQuantizationType.IQ1_S, 32),
}
GRIDS = {"iq2xxs": "IQ2_XXS", "iq2xs": "IQ2_XS", "iq2s": "IQ2_S", "iq3xxs": "IQ3_XXS", "iq3s": "IQ3_S", "iq1s": "IQ1_S"}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_the_grids_are_gguf_pys(name: str) -> None:
    cls = getattr(gguf.quants, GRIDS[name])
    cls.init_grid()
    theirs = np.asarray(cls.grid).reshape(cls.grid_shape)
    assert np.array_equal(np.array(lattice.grid(name), dtype=np.float32), theirs)
    assert f"k{name.capitalize()}Grid[{cls.grid_shape[0]}]" in lattice.cpp_text()


def as_gguf_blocks(q: Any, method: str) -> np.ndarray[Any, Any]:
    """The portable layout (blocks less d, d) as the GGUF tensor bytes it came from."""
    element = ktforge.formats.by_name(method).element
    rows, supers = q.scale.shape
    d = np.ascontiguousarray(q.scale).view(np.uint8).reshape(rows, supers, 2)
    rest = q.weight.reshape(rows, supers, LATTICE_BLOCK_BYTES[element] - 2)
    return np.concatenate([d, rest], axis=-1).reshape(rows, -1)


@pytest.mark.parametrize("method", TYPES)
def test_ktforges_blocks_are_gguf_blocks_gguf_py_reads_as_ktforge_does(method: str) -> None:
    kind, group = TYPES[method]
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((17, 300)) * rng.uniform(0.01, 2, (17, 1))).astype(np.float32)  # K padded to 512
    w[3] = 0.0  # a row of zeros
    q = quantize(w, method, group)
    assert q.weight.shape == (17, 2 * (LATTICE_BLOCK_BYTES[ktforge.formats.by_name(method).element] - 2))
    theirs = gguf.quants.dequantize(as_gguf_blocks(q, method), kind)  # [17, 512]
    ours = dequantize(q, method, 300)
    assert np.array_equal(ours, theirs[:, :300])
    assert not ours[3].any()
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize(np.where(w > 1, np.nan, w).astype(np.float32), method, group)


def fixture_experts(stem: str) -> dict[str, np.ndarray[Any, Any]]:
    reader = gguf.GGUFReader(FIXTURES / f"qwen3moe-{stem}.gguf")
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors if "_exps" in t.name}


@pytest.mark.parametrize("method", TYPES)
def test_the_quantizer_is_near_llama_cpps_on_the_same_weights(method: str) -> None:
    # the F32 fixture's experts, quantized by ktforge and by llama.cpp (with its importance matrix,
    # which weighs the error it minimizes: its unweighted error may be the larger); measured here:
    # ktforge's relative RMS error 0.90-1.03x llama.cpp's for the 2- and 3-bit types, 1.08-1.17x for IQ1_S
    kind, group = TYPES[method]
    source, theirs = fixture_experts("F32"), fixture_experts(kind.name)
    for name, w in source.items():
        ours = dequantize(quantize(w, method, group), method, w.shape[-1])

        def rms(values: np.ndarray[Any, Any], w: np.ndarray[Any, Any] = w) -> float:
            return float(np.sqrt(np.mean((values - w) ** 2) / np.mean(w**2)))

        assert rms(ours) < 1.25 * rms(theirs[name]), name
