"""The README is a front page that stays true: short, its links alive, its format table the
format table's (data/formats.json), how to run a model on its first screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ktforge import formats

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    # a terminal's first screenful (50 lines) reaches how to run a model
    assert any(line.startswith("## Run a model") for line in lines[:50])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_local_link_leads_to_a_file(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links, not code
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    local = [t for t in targets if t and not re.match(r"[a-z]+:", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, missing
    if page == README:  # every page of docs/ is reachable from the front page
        assert {p.name for p in PAGES[1:]} <= {Path(t).name for t in local}


def test_the_format_table_is_the_format_tables() -> None:
    # | format | bytes / weight | what it is | AMX tiles |
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| [^|\d][^|]* \| [^|]+ \|$", README.read_text(), flags=re.M)
    assert sorted(name for name, _ in rows) == sorted(formats.names())
    for name, shown in rows:
        f = formats.by_name(name)
        actual = f.bytes_per_weight(formats.default_group(name) if f.grouped else 0)
        assert float(shown) == pytest.approx(actual, abs=1e-4), name
