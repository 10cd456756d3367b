"""The session's vLLM runs (session.py), for the tests that read them."""

from __future__ import annotations

import pytest

from tests.engines.vllm import session
from tests.engines.vllm.runs import Runs


@pytest.fixture(scope="session")
def vllm() -> Runs:
    """Every run of runs.py's plan, by name, over the session's checkpoints."""
    return session.start().result()[1]
