"""ktforge: the fastest correct CPU MoE kernels for this machine, built, verified and explained."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
