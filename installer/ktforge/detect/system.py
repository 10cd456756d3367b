"""Operating-system facts: kernel, distribution, NUMA layout, memory, hypervisor."""

from __future__ import annotations

import platform
import re
from pathlib import Path

from ktforge.detect import topology
from ktforge.detect.report_types import SystemFacts


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def os_release() -> dict[str, str]:
    import distro  # imported here: only live collection needs it

    return {
        "id": distro.id(),
        "name": distro.name(pretty=True),
        "version": distro.version(),
        "like": distro.like(),
    }


def collect() -> SystemFacts:
    """Raw OS facts, JSON-ready (the report interprets them)."""
    numa = topology.read_live().to_json()
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "kernel_release": platform.release(),
        "os_release": os_release() if platform.system() == "Linux" else None,
        "numa_nodes": numa["nodes"],
        "online_cpus": numa["online_cpus"],
        "affinity": numa["affinity"],
        "meminfo": _read("/proc/meminfo"),
        "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "hypervisor_type": (_read("/sys/hypervisor/type") or "").strip() or None,
        "topology": numa,
    }


def parse_meminfo(text: str | None) -> dict[str, int]:
    """/proc/meminfo -> {field: bytes or count}."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        match = re.match(r"^(\w+):\s+(\d+)(\s+kB)?", line)
        if match:
            number = int(match.group(2))
            values[match.group(1)] = number * 1024 if match.group(3) else number
    return values


def memory_available() -> int | None:
    """Bytes this process may still take: MemAvailable plus free swap, capped by its cgroup's
    memory.max less memory.current (cgroup v2); None where /proc/meminfo cannot be read."""
    try:
        info = parse_meminfo(Path("/proc/meminfo").read_text())
    except OSError:
        return None
    if "MemAvailable" not in info:
        return None
    free = info["MemAvailable"] + info.get("SwapFree", 0)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(free, 0)


def kernel_version(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None
