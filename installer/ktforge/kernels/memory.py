"""Whether this process can hold a layer's packed weights, asked before anything is read or
allocated: a kernel's allocation beyond it would end in the OOM killer, not an exception."""

from __future__ import annotations

from ktforge import formats
from ktforge.detect.system import memory_available


def check_layer_fits(experts: int, hidden: int, inner: int, gate_up: tuple[str, int], down: tuple[str, int]) -> None:
    """MemoryError, with the numbers, for packed weights this process cannot hold (an OOM kill later)."""
    per_weight = [formats.by_name(m).bytes_per_weight(formats.group_for(m, g)) for m, g in (gate_up, down)]
    need = int(experts * hidden * inner * (2 * per_weight[0] + per_weight[1]))
    have = memory_available()
    if have is not None and need > have:
        raise MemoryError(
            f"MoE: this layer's packed weights take {need / 2**30:.1f} GiB ({experts} experts of {hidden} x {inner}, "
            f"{gate_up[0]} / {down[0]}); this process can take {have / 2**30:.1f} GiB (MemAvailable, free swap, cgroup)"
        )
