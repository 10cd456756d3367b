"""Writes installer/ktforge/data/lattice_grids.json: the grids of llama.cpp's i-quants (the values
each grid index stands for: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S/IQ1_M), taken from
gguf-py, llama.cpp's own Python package, in its compact form (each entry's values as indices into
``map``, packed into hex digits as gguf-py's ``init_grid`` reads them). ktforge reads the file for
its dequantization and generates the kernels' C++ tables from it (``python -m ktforge.formats cpp``);
tests/kernels/test_lattice.py holds the file to gguf-py's grids.

    python scripts/lattice_grids.py [installer/ktforge/data/lattice_grids.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf.quants as quants

# ktforge's name of each grid -> gguf-py's class holding it
GRIDS = {"iq2xxs": "IQ2_XXS", "iq2xs": "IQ2_XS", "iq2s": "IQ2_S", "iq3xxs": "IQ3_XXS", "iq3s": "IQ3_S", "iq1s": "IQ1_S"}


def main(target: str) -> int:
    grids = {}
    for name, cls_name in GRIDS.items():
        cls = getattr(quants, cls_name)
        entries, values = cls.grid_shape
        grids[name] = {"entries": entries, "values": values, "map": list(cls.grid_map), "hex": cls.grid_hex.decode()}
    comment = (
        "The i-quants' grids (llama.cpp's ggml-common.h iq2xxs_grid and the others), as gguf-py 0.19's quants.py "
        "states them: entry e's values are map[code] for the codes packed, lowest bits first, in the bytes the hex "
        "digits spell (bits per code: enough for len(map)). Written by scripts/lattice_grids.py."
    )
    Path(target).write_text(json.dumps({"_comment": comment, "grids": grids}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "installer/ktforge/data/lattice_grids.json"))
