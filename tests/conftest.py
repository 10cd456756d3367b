from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CPUINFO_FIXTURES = FIXTURES / "cpuinfo"
HOST_FIXTURES = FIXTURES / "host"


def pytest_configure(config: pytest.Config) -> None:
    # One private probe cache for the whole run: tests never read or write the user's cache.
    if "KTFORGE_CACHE_DIR" not in os.environ:
        os.environ["KTFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="ktforge-test-cache-")
    os.environ.pop("NO_COLOR", None)


VLLM_TESTS = Path(__file__).parent / "engines" / "vllm"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The vLLM tests last (a stable sort: each part keeps its order): their runs take minutes,
    # mostly in processes that start, compile and wait on each other; begun when collection
    # ends (below), they run beside the rest of the suite, not before their tests.
    items.sort(key=lambda item: item.path.is_relative_to(VLLM_TESTS))


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("vllm" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.engines.vllm import session as vllm_session

        vllm_session.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    vllm_session = sys.modules.get("tests.engines.vllm.session")  # loaded only where collected
    if vllm_session is not None:
        vllm_session.finish()


def read_proc_cpuinfo_flags() -> set[str]:
    """The kernel's own flag list, read directly: an independent witness for the probes."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("/proc/cpuinfo has no flags line: these tests need x86-64 Linux")


@pytest.fixture(scope="session")
def host_flags() -> set[str]:
    return read_proc_cpuinfo_flags()


def terminal_wrap(text: str, width: int) -> str:
    """Cut every line at ``width`` columns, mid-word, as a narrow terminal shows a flat dump."""
    out = []
    for line in text.splitlines():
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out) + "\n"
