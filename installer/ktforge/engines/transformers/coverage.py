"""``ktforge.transformers.sweep()``: every experts class of transformers judged by
:func:`ktforge.transformers.why_unsupported`, each built from its model type's default config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktforge.engines.transformers import why_unsupported


def sweep() -> list[tuple[str, str, str | None]]:
    """Every experts class of transformers' models that uses the experts interface, built from
    its model type's default config on the meta device (no memory): (model type, class, why it
    falls back or None)."""
    import importlib
    import importlib.util
    import inspect
    import pkgutil

    import torch
    import transformers.models
    from transformers import AutoConfig

    rows: list[tuple[str, str, str | None]] = []
    for info in sorted(pkgutil.iter_modules(transformers.models.__path__), key=lambda m: m.name):
        model_type = info.name
        try:
            source = importlib.util.find_spec(f"transformers.models.{model_type}.modeling_{model_type}")
        except (ImportError, ValueError):
            continue
        if (
            source is None
            or source.origin is None
            or "@use_experts_implementation" not in Path(source.origin).read_text()
        ):
            continue
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        classes: list[Any] = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__
            and hasattr(c, "_apply_gate")
            and hasattr(getattr(c, "forward", None), "__wrapped__")
        ]
        try:
            config = AutoConfig.for_model(model_type)
        except (ValueError, KeyError) as exc:
            rows += [(model_type, c.__name__, f"no default config ({str(exc)[:60]})") for c in classes]
            continue
        for cls in classes:
            error = "no config"
            for candidate in _configs(config):
                try:
                    with torch.device("meta"):
                        experts = cls(candidate)
                    rows.append((model_type, cls.__name__, why_unsupported(experts, layout_only=True)))
                    break
                except Exception as exc:  # a class that needs another sub-config: try the next
                    error = f"{type(exc).__name__}: {str(exc)[:100]}"
            else:
                rows.append((model_type, cls.__name__, f"could not be built from its default config ({error})"))
    return rows


def _configs(config: Any, depth: int = 2) -> list[Any]:
    """A config and its sub-configs (text, thinker, talker, ...), breadth first."""
    from transformers import PretrainedConfig

    found, frontier = [config], [config]
    for _ in range(depth):
        frontier = [v for c in frontier for v in vars(c).values() if isinstance(v, PretrainedConfig)]
        found += frontier
    return found
