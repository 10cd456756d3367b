"""ktforge: the fastest correct CPU MoE kernels for this machine, built, verified and explained."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["MoE", "NumaShare", "__version__", "build_info"]


def __getattr__(name: str) -> Any:
    # The kernels load on first use, so `kt doctor` works even when the extension is broken.
    if name in ("MoE", "build_info"):
        from ktforge.kernels import moe

        return getattr(moe, name)
    if name == "NumaShare":
        from ktforge.kernels.numa import NumaShare

        return NumaShare
    raise AttributeError(f"module 'ktforge' has no attribute {name!r}")
