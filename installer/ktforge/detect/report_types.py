"""The machine report's shape, as types: what every consumer may read, checked by mypy.

These are TypedDicts, so a report is still plain JSON (``json.dumps`` writes it, a
snapshot replays into it) while every access is typed. The doctor's JSON schema is
generated from them (:mod:`ktforge.doctor.schema`); a test keeps the committed
schema equal to that generation.

Schema-only facts ride on ``Annotated``: :class:`Schema` adds keywords (a pattern, an enum
computed from a data table) that a Python type cannot say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NotRequired, TypedDict

REPORT_SCHEMA_VERSION: Literal[1] = 1


@dataclass(frozen=True)
class Schema:
    """Extra JSON-schema keywords for an ``Annotated`` field; ``enum_from`` names a function
    of :mod:`ktforge.doctor.schema` that lists the allowed values from a data table."""

    keywords: dict[str, Any] = field(default_factory=dict)
    enum_from: str | None = None


SourceKind = Literal["live", "snapshot", "cpuinfo", "lscpu", "lscpu-json", "cpuid-dump", "sysctl"]
AmxVerdict = Literal[
    "available",
    "no-amx-cpu",
    "os-disabled",
    "kernel-unsupported",
    "permission-denied",
    "execution-failed",
    "probe-failed",
    "unknown",
]
# refused: it imports, but the import guard refuses it (built for another CPU or install)
ExtensionState = Literal["ok", "missing", "broken", "stale", "refused"]
GateStatus = Literal["pass", "fail", "unknown"]
# The recommended recipe: its's name, or "none" / "unknown" (see build.recipes.choose).
RecommendedRecipe = Annotated[str, Schema(enum_from="recommended_recipes")]


# --- raw evidence (what the probes print, before interpretation) --------------------------


class ProbeOutcomeJson(TypedDict):
    status: str
    detail: str
    data: dict[str, Any] | None


class PycpuinfoResult(TypedDict):
    status: Literal["ok", "unavailable", "failed"]
    detail: NotRequired[str]
    vendor: NotRequired[str]
    brand: NotRequired[str]
    family: NotRequired[int]
    model: NotRequired[int]
    stepping: NotRequired[int]
    flags: NotRequired[list[str]]


class BlisCandidate(TypedDict):
    path: str
    library_dir: str
    header: str | None
    probe: ProbeOutcomeJson


class BlisDiscovery(TypedDict):
    searched: list[str]
    candidates: list[BlisCandidate]


class SystemFacts(TypedDict):
    system: str
    machine: str
    kernel_release: str
    os_release: dict[str, str] | None
    numa_nodes: dict[str, list[int]]
    online_cpus: list[int] | None
    affinity: list[int] | None
    meminfo: str | None
    thp: str | None
    hypervisor_type: str | None
    topology: NotRequired[NumaSection]


class Compiler(TypedDict):
    name: str
    path: str
    family: str
    version: str
    language: Literal["c", "c++"]
    accepts: dict[str, bool]


class Tool(TypedDict):
    name: str
    path: str | None
    version: str | None


class PythonHeaders(TypedDict):
    include_dir: str
    present: bool


class Toolchain(TypedDict):
    compilers: list[Compiler]
    cmake: Tool
    ninja: Tool
    python_headers: PythonHeaders


class BackendSelection(TypedDict):
    """The level backend='auto' runs here, why each better compiled one does not, and the
    KTFORGE_BACKEND override if one is set."""

    auto: str
    why_not: dict[str, str]
    override: str | None
    disabled_cpu_features: list[str]  # KTFORGE_DISABLE_CPU_FEATURES in force


class ExtensionStatus(TypedDict):
    """The native extension as a child process found it (``detect.extension.inspect``), and
    in the report what this CPU lacks of what it was built for."""

    status: ExtensionState
    path: NotRequired[str | None]
    error: NotRequired[str]
    build_info: NotRequired[dict[str, Any]]
    package_version: NotRequired[str]
    record: NotRequired[dict[str, Any] | None]
    selection: NotRequired[BackendSelection]
    missing_cpu_features: NotRequired[list[str]]
    backends_missing_features: NotRequired[dict[str, list[str]]]


# --- the report ----------------------------------------------------------------------------


class Source(TypedDict):
    kind: SourceKind
    origin: str | None


class ClosestNewer(TypedDict):
    name: str
    missing: list[str]


class ModelTableMatch(TypedDict):
    name: str
    missing_expected: list[str]
    unexpected: list[str]


class Microarchitecture(TypedDict):
    name: str
    source: Literal["archspec", "model-table"]
    by_features: str
    hidden: list[str]
    hidden_used_by_kernels: list[str]
    products: str | None
    closest_newer: ClosestNewer | None
    model_table: ModelTableMatch | None


class ReportedFeature(TypedDict):
    cpuid: bool | None
    kernel: bool | None
    usable: bool | None


class OsState(TypedDict):
    """Which register state XCR0 enables; None where XCR0 was not read."""

    xcr0: int | None
    avx: bool | None
    avx512: bool | None
    amx: bool | None


class TilePalette(TypedDict):
    total_tile_bytes: int
    bytes_per_tile: int
    bytes_per_row: int
    max_names: int
    max_rows: int


class CpuSection(TypedDict):
    arch: str | None
    vendor: str | None
    brand: str | None
    family: int | None
    model: int | None
    stepping: int | None
    microarchitecture: Microarchitecture
    hypervisor: str | None
    features: list[str] | None
    usable_features: list[str] | None  # less disabled_features
    disabled_features: list[str]  # KTFORGE_DISABLE_CPU_FEATURES of the process that looked (live only)
    kernel_flags_known: bool
    reported: dict[str, ReportedFeature]
    os_state: OsState
    tile_palette: TilePalette | None
    cpuid_source: Literal["probe", "dump", "py-cpuinfo"] | None
    cpuid_error: str | None
    notes: list[str]
    logical_cpus: int | None


class AmxSection(TypedDict):
    verdict: AmxVerdict
    explanation: str
    probe_status: str | None
    supported_mask: int | None
    permitted_before: int | None
    request_errno: int | None
    request_errno_name: str | None
    permitted_after: int | None
    permitted: bool | None
    execution: str | None


class BlisLibrary(TypedDict):
    path: str
    library_dir: str
    loaded: bool
    load_error: str | None
    probe_status: str
    probe_detail: str
    version: str | None
    threading: str
    header: str | None
    has_addon: bool
    symbols: dict[str, bool]
    gemm_s8s8s32: str
    usable: bool


class BlisSection(TypedDict):
    searched: list[str]
    libraries: list[BlisLibrary]
    selected: str | None
    selected_library_dir: str | None


class OsSection(TypedDict):
    system: str | None
    kernel_release: str | None
    kernel_version: list[int] | None
    distribution: dict[str, str] | None


class NumaNodeJson(TypedDict):
    cpus: list[int]
    usable_cpus: list[int]
    memory_bytes: int | None
    distances: dict[str, int]


class NumaSection(TypedDict):
    """ktforge.detect.topology's Topology: the nodes' CPUs (``nodes``), and where the live reader
    or a numactl dump gave them, each node's detail and the process's limits and policy."""

    nodes: dict[str, list[int]]
    online_cpus: list[int] | None
    affinity: list[int] | None
    detail: NotRequired[dict[str, NumaNodeJson]]
    memory_nodes: NotRequired[list[int] | None]
    memory_policy: NotRequired[str | None]
    policy_nodes: NotRequired[list[int]]
    numa_balancing: NotRequired[int | None]
    sockets: NotRequired[list[list[int]]]
    mode: NotRequired[str]
    source: NotRequired[str]


class MemorySection(TypedDict):
    total_bytes: int | None
    available_bytes: int | None
    hugepages_total: int | None
    hugepages_free: int | None
    hugepage_size_bytes: int | None
    transparent_hugepages: str | None


class Disagreement(TypedDict):
    topic: str
    detail: str


class ProbeSummary(TypedDict):
    status: str | None
    detail: str | None


class Probes(TypedDict):
    cpu: ProbeSummary | None
    amx_permission: ProbeSummary | None


class MachineReport(TypedDict):
    """What the machine is and allows: facts only (the choice of backend is the build stage's,
    :class:`ktforge.builder.assessment.Assessment`)."""

    schema_version: Literal[1]
    source: Source
    cpu: CpuSection
    amx: AmxSection
    blis: BlisSection | None
    os: OsSection
    numa: NumaSection | None
    memory: MemorySection | None
    toolchain: Toolchain | None
    extension: ExtensionStatus | None
    disagreements: list[Disagreement]
    probes: Probes
