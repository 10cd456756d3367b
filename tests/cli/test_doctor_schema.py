"""The doctor's JSON schema is generated from the report's types, and it is strict: what the
types do not allow, the schema rejects."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from ktforge.builder.assessment import assess
from ktforge.detect import evidence
from ktforge.doctor import run_checks
from ktforge.doctor.schema import doctor_document, generate, to_text
from ktforge.resources import data_path

from ..conftest import CPUINFO_FIXTURES, HOST_FIXTURES

VALIDATOR = jsonschema.Draft202012Validator(generate())


def _document(path: str) -> dict[str, Any]:
    report = assess(evidence.from_file(path))
    document: dict[str, Any] = json.loads(to_text(doctor_document(report, run_checks(report))))
    return document


def test_the_committed_schema_is_what_the_types_generate() -> None:
    committed = json.loads(data_path("doctor.schema.json").read_text())
    assert committed == generate(), (
        "regenerate: python -m ktforge.doctor.schema installer/ktforge/data/doctor.schema.json"
    )


@pytest.mark.parametrize(
    "fixture",
    [
        *(p for p in sorted(CPUINFO_FIXTURES.iterdir()) if not p.name.startswith("LICENSE")),
        *sorted(HOST_FIXTURES.iterdir()),
    ],
    ids=lambda p: p.name,
)
def test_every_fixture_machine_s_document_is_valid(fixture: Any) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in VALIDATOR.iter_errors(_document(str(fixture)))]
    assert not errors


@pytest.fixture(scope="module")
def zen4() -> dict[str, Any]:
    return _document(str(CPUINFO_FIXTURES / "linux-rocky8.5-zen4"))


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("report", "cpu", "family"), "25"),  # a string where the type says int
        (("report", "cpu", "os_state", "avx512"), "yes"),
        (("report", "amx", "verdict"), "maybe"),  # not one of the Literal's values
        (("report", "recipe", "recommended"), "avx1024"),  # not a recipe of the table
        (("report", "cpu", "microarchitecture", "source"), "guess"),
        (("checks", 0, "id"), "no-dot"),  # the pattern on FindingId
        (("checks", 0, "status"), "fine"),
        (("report", "source", "kind"), "floppy"),
    ],
)
def test_a_wrong_value_is_rejected(zen4: dict[str, Any], where: tuple[Any, ...], value: object) -> None:
    document = copy.deepcopy(zen4)
    assert VALIDATOR.is_valid(document)
    node = document
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    assert not VALIDATOR.is_valid(document)


@pytest.mark.parametrize(
    ("where", "required"),
    [
        (("report",), "probes"),
        (("report", "cpu"), "usable_features"),
        (("report", "amx"), "permitted"),
        (("report", "recipe"), "recommended"),
        (("summary",), "warn"),
        (("report", "os"), "kernel_release"),
    ],
)
def test_an_unknown_key_or_a_missing_one_is_rejected(
    zen4: dict[str, Any], where: tuple[str, ...], required: str
) -> None:
    document = copy.deepcopy(zen4)
    node = document
    for key in where:
        node = node[key]
    node["surprise"] = 1
    assert not VALIDATOR.is_valid(document)
    del node["surprise"]
    del node[required]
    assert not VALIDATOR.is_valid(document)


def test_optional_keys_stay_optional(zen4: dict[str, Any]) -> None:
    # not_seen_by_source appears only on a provisional or open choice (NotRequired in the type)
    document = copy.deepcopy(zen4)
    assert "not_seen_by_source" in document["report"]["recipe"]
    del document["report"]["recipe"]["not_seen_by_source"]
    assert VALIDATOR.is_valid(document)
