"""vLLM as on a CPU without AMX, on any host: vLLM picks its CPU kernels by
torch.cpu._is_amx_tile_supported(), so this answers no (the kernels of ktforge keep what the
live report gives them). Still asks for tile permission, as amx_permission/ does."""

import runpy
from pathlib import Path

import torch

torch.cpu._is_amx_tile_supported = lambda: False
runpy.run_path(str(Path(__file__).parents[1] / "amx_permission" / "sitecustomize.py"))
