"""`kt bench`: one MoE layer of real models, against this machine's roofline.

For every case the bound is ``max(ops / dot peak, weight bytes touched / read bandwidth)``:
the multiply-adds at the backend's own dot-product peak, or the packed weights (scales
included) of the experts the routing touched, at the read bandwidth; both peaks are measured
in the same run (best of several, every thread). A case reports its median time, its spread
and the % of its bound reached. Backends and the PyTorch peer are timed interleaved (A B A B,
the order rotating each round), so drift on a shared machine hits all of them alike: ratios,
not bare times, are what carry over between runs.

The engine, by concern: ``model`` (weights, routing), ``bounds`` (peaks, rooflines), ``timing``
(interleaved contenders), ``options`` (checked, typed) and ``run`` (typed events). The CLI
parses and prints (``ktforge.cli.bench_text``).
"""

from __future__ import annotations

from ktforge.bench import bounds, model
from ktforge.bench.bounds import DOT_PEAK, Peaks, Roofline, roofline
from ktforge.bench.model import Model, experts_that_fit, make_weights, routing
from ktforge.bench.options import DECODE_MAX_TOKENS, DEFAULT_TOKENS, METHODS, BenchOptions, check_options
from ktforge.bench.run import CaseDone, Event, Final, Header, Result, run
from ktforge.bench.timing import Contender, time_interleaved

__all__ = [
    "DECODE_MAX_TOKENS",
    "DEFAULT_TOKENS",
    "DOT_PEAK",
    "METHODS",
    "BenchOptions",
    "CaseDone",
    "Contender",
    "Event",
    "Final",
    "Header",
    "Model",
    "Peaks",
    "Result",
    "Roofline",
    "bounds",
    "check_options",
    "experts_that_fit",
    "make_weights",
    "model",
    "roofline",
    "routing",
    "run",
    "time_interleaved",
]
