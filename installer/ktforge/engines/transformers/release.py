"""ktforge.transformers' loading of a Hugging Face release (safetensors): each layer's experts,
checked against the module's, served from the file's values in its own format where ktforge has
it (:func:`ktforge.transformers.load_checkpoint`)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

import ktforge


def load_release(model: Any, directory: Path) -> list[int]:
    """load_checkpoint for a checkpoint directory (see there)."""
    import torch

    from ktforge.checkpoints import fingerprint
    from ktforge.checkpoints.checkpoint import Checkpoint
    from ktforge.engines.transformers import (
        _check_fingerprint,
        _install_loaded,
        _load_module_biases,
        _modules_of_layers,
        _settings,
        activation_of,
    )
    from ktforge.formats.quantize import Nvfp4Groups, stored_rows

    layers: list[tuple[Any, ktforge.MoE, int]] = []
    with Checkpoint(directory) as checkpoint:
        sizes = (checkpoint.experts, 2 * checkpoint.intermediate, checkpoint.hidden)
        for name, module, index in _modules_of_layers(
            model, set(checkpoint.moe_layers), directory, sizes, "the checkpoint"
        ):

            def rows_of(expert: int, projection: str, index: int = index, unscaled: bool = False) -> Any:
                stored = checkpoint.expert(index, expert, projection)
                if unscaled and isinstance(stored, Nvfp4Groups):
                    stored = dataclasses.replace(stored, global_scale=np.ones_like(stored.global_scale))
                return stored_rows(stored, fingerprint.sampled)

            accepted = [fingerprint.record(checkpoint.experts, rows_of)]
            if checkpoint.stored_method(index) == "nvfp4":
                # transformers 5.23 dequantizes compressed-tensors' per-expert NVFP4 without the tensor
                # scale (huggingface/transformers#48371): its copy is the file's values over it
                accepted.append(fingerprint.record(checkpoint.experts, functools.partial(rows_of, unscaled=True)))
            _check_fingerprint(directory, accepted, name, module, "load that checkpoint")
            native = checkpoint.stored_method(index) is not None
            layer = ktforge.MoE.from_pretrained(
                directory,
                index,
                method=None if native else _settings.method,
                group_size=None if native else _settings.group_size,
                backend=_settings.backend,
                threads=_settings.threads or torch.get_num_threads(),
                activation=activation_of(module),
            )
            _load_module_biases(module, layer)
            layers.append((module, layer, index))
    return _install_loaded(model, layers, release=True)
