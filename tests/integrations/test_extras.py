"""`pip install ktforge[transformers]` installs what transformers needs for the paths the README
documents: a GGUF (``gguf_file=``) needs gguf, an FP8 checkpoint on a CPU accelerate, each at
least at the version transformers itself checks for."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def extra(name: str) -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {(r := Requirement(text)).name: r for text in project["optional-dependencies"][name]}


@pytest.mark.parametrize(
    ("package", "minimum"), [("gguf", "GGUF_MIN_VERSION"), ("accelerate", "ACCELERATE_MIN_VERSION")]
)
def test_the_transformers_extra_installs_what_transformers_checks_for(package: str, minimum: str) -> None:
    import transformers.utils.import_utils as transformers_imports

    required = Version(getattr(transformers_imports, minimum))
    requirement = extra("transformers").get(package)
    assert requirement is not None, f"ktforge[transformers] lacks {package}"
    # the extra's lowest allowed version is at least transformers' own floor
    floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    assert floors and min(floors) >= required, (requirement, required)
