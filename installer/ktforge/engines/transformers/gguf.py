"""ktforge.transformers' GGUF loading: a model transformers loaded from a GGUF (``gguf_file=``)
runs its experts from the file's quantized values (:func:`ktforge.transformers.load_checkpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ktforge


def load_gguf(model: Any, path: Path) -> list[int]:
    """load_checkpoint for a GGUF: each layer's experts, every one, checked against the module's
    (sampled rows, up to bf16 rounding), then served from the file's values."""
    import numpy as np
    import torch

    from ktforge.checkpoints import fingerprint
    from ktforge.checkpoints.gguf import GgufCheckpoint
    from ktforge.engines.transformers import (
        _check_fingerprint,
        _install_loaded,
        _load_module_biases,
        _modules_of_layers,
        _settings,
        activation_of,
    )
    from ktforge.formats.quantize import Quantized, dequantize

    layers: list[tuple[Any, ktforge.MoE, int]] = []
    with GgufCheckpoint(path) as checkpoint:
        sizes = (checkpoint.experts, 2 * checkpoint.intermediate, checkpoint.hidden)
        for name, module, index in _modules_of_layers(model, set(checkpoint.moe_layers), path, sizes, "the GGUF"):
            served = checkpoint.stored_formats(index)
            stored = {p: checkpoint.quantized(index, p) for p in served}

            def rows_of(
                expert: int, projection: str, stored: dict[str, Quantized] = stored, served: Any = served
            ) -> Any:
                q = stored[projection]
                rows = fingerprint.sampled(q.weight.shape[1])  # those rows of the expert only
                one = Quantized(
                    q.weight[expert][rows],
                    None if q.scale is None else q.scale[expert][rows],
                    None if q.zero is None else q.zero[expert][rows],
                    global_scale=None if q.global_scale is None else q.global_scale[expert][rows],
                )
                K = checkpoint.intermediate if projection == "down" else checkpoint.hidden
                return np.asarray(dequantize(one, served[projection][0], K), dtype=np.float32)

            _check_fingerprint(path, fingerprint.record(checkpoint.experts, rows_of), name, module, "load that GGUF")
            layer = ktforge.MoE.from_pretrained(
                path,
                index,
                backend=_settings.backend,
                threads=_settings.threads or torch.get_num_threads(),
                activation=activation_of(module),
            )
            _load_module_biases(module, layer)
            layers.append((module, layer, index))
    return _install_loaded(model, layers, release=True)
