"""KTFORGE_DISABLE_CPU_FEATURES: the CPU features this process must not use, as if the CPU lacked them.

One machine then tests, and runs, as the lower kinds of host (numpy's NPY_DISABLE_CPU_FEATURES,
oneDNN's ONEDNN_MAX_CPU_ISA). The value is a comma- or space-separated list of the feature names
that decide a kernel (the Linux spellings of :data:`MASKABLE`); any other name is an error.

A mask only ever takes features away: the machine report's usable features, the recipe, the
extension's backend choice and every kernel's path (through the extension's one ``cpu_has``,
which the extension sets from :func:`from_environment` when it is imported) see the CPU less
these features. This module is the one reader of the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final

from ktforge.detect.features import COMPILER_MACROS

VARIABLE: Final = "KTFORGE_DISABLE_CPU_FEATURES"
# the features a kernel's path depends on: those a compiler flag turns on
MASKABLE: Final = frozenset(COMPILER_MACROS.values())


class MaskError(ValueError):
    """The variable names something that is not a maskable CPU feature."""


def parse(text: str) -> frozenset[str]:
    """The features ``text`` names (commas or spaces between them; case as Linux spells them)."""
    names = frozenset(n for n in re.split(r"[\s,]+", text.strip().lower()) if n)
    unknown = sorted(names - MASKABLE)
    if unknown:
        raise MaskError(
            f"{VARIABLE} names {', '.join(repr(n) for n in unknown)}, which "
            f"{'is not a CPU feature' if len(unknown) == 1 else 'are not CPU features'} ktforge can disable; "
            f"known: {', '.join(sorted(MASKABLE))}"
        )
    return names


def from_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """The features disabled in this process, sorted (empty: no mask)."""
    return sorted(parse((os.environ if environ is None else environ).get(VARIABLE, "")))
