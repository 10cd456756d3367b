"""``kt doctor --json``: the document's type, the one place it is written as JSON, and its
JSON schema, generated from the types.

``installer/ktforge/data/doctor.schema.json`` is this module's output, committed for
people who validate our JSON without Python; a test fails when it differs from what the
types generate. Regenerate with ``python -m ktforge.doctor.schema installer/ktforge/data/doctor.schema.json``.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args, get_origin, get_type_hints, is_typeddict

from ktforge import __version__
from ktforge.builder.assessment import Assessment
from ktforge.detect.report_types import RecommendedRecipe, Schema
from ktforge.doctor import Finding, FindingJson, Summary, summarize

DOCTOR_SCHEMA_VERSION: Literal[2] = 2
SCHEMA_ID = f"https://ktforge.invalid/schemas/doctor-{DOCTOR_SCHEMA_VERSION}.json"


class DoctorDocument(TypedDict):
    """kt doctor --json: the findings, their summary and the machine report they read."""

    schema_version: Literal[2]
    ktforge_version: str
    recommended_recipe: RecommendedRecipe
    summary: Summary
    checks: list[FindingJson]
    report: Assessment


def doctor_document(report: Assessment, findings: Sequence[Finding]) -> DoctorDocument:
    return {
        "schema_version": DOCTOR_SCHEMA_VERSION,
        "ktforge_version": __version__,
        "recommended_recipe": report["recipe"]["recommended"],
        "summary": summarize(list(findings)),
        "checks": [f.to_json() for f in findings],
        "report": report,
    }


def to_text(document: object) -> str:
    """The one JSON spelling of ktforge's documents (sorted keys: diffs stay readable)."""
    return json.dumps(document, indent=1, sort_keys=True)


# --- the schema, from the types -------------------------------------------------------------


def recommended_recipes() -> list[str]:
    """Every value ``recipe.recommended`` can take: the recipes, best first, then none/unknown."""
    from ktforge.builder.recipes import load_recipes

    return [r.name for r in load_recipes()] + ["none", "unknown"]


_ENUM_SOURCES = {"recommended_recipes": recommended_recipes}
_SCALARS: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class _Generator:
    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}

    def typed_dict(self, cls: type) -> dict[str, Any]:
        name = cls.__name__
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder first: types may refer to themselves
            hints = get_type_hints(cls, include_extras=True)
            node: dict[str, Any] = {"type": "object"}
            if cls.__doc__:
                node["description"] = " ".join(cls.__doc__.split())
            # not cls.__required_keys__: under postponed annotations Python 3.11 cannot see NotRequired
            node["required"] = [k for k, v in hints.items() if get_origin(v) is not typing.NotRequired]
            node["additionalProperties"] = False
            node["properties"] = {k: self.node(v) for k, v in hints.items()}
            self.defs[name] = node
        return {"$ref": f"#/$defs/{name}"}

    def node(self, tp: Any) -> dict[str, Any]:
        origin = get_origin(tp)
        if origin is typing.Annotated:
            base, *extras = get_args(tp)
            schema = next((e for e in extras if isinstance(e, Schema)), Schema())
            if schema.enum_from is not None:
                return {"enum": _ENUM_SOURCES[schema.enum_from]()}
            return {**self.node(base), **schema.keywords}
        if origin in (typing.NotRequired, typing.Required):
            return self.node(get_args(tp)[0])
        if origin is Literal:
            values = list(get_args(tp))
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        if origin in (typing.Union, types.UnionType):
            return self.union(get_args(tp))
        if origin is list:
            return {"type": "array", "items": self.node(get_args(tp)[0])}
        if origin is dict:
            value = get_args(tp)[1]
            return {"type": "object"} if value is Any else {"type": "object", "additionalProperties": self.node(value)}
        if tp is Any:
            return {}
        if tp is type(None):
            return {"type": "null"}
        if is_typeddict(tp):
            return self.typed_dict(tp)
        if tp in _SCALARS:
            return {"type": _SCALARS[tp]}
        raise TypeError(f"no JSON schema for {tp!r}")

    def union(self, members: tuple[Any, ...]) -> dict[str, Any]:
        nodes = [self.node(m) for m in members]
        # X | None, with X a plain type: {"type": [X, "null"]} (the usual spelling)
        if all(set(n) <= {"type", "items", "additionalProperties"} for n in nodes):
            kinds = [n["type"] for n in nodes]
            merged: dict[str, Any] = {}
            for n in nodes:
                merged.update({k: v for k, v in n.items() if k != "type"})
            return {"type": kinds if len(kinds) > 1 else kinds[0], **merged}
        if all("enum" in n or n == {"type": "null"} for n in nodes):
            return {"enum": [v for n in nodes for v in n.get("enum", [None])]}
        return {"anyOf": nodes}


def generate() -> dict[str, Any]:
    """The JSON schema of :class:`DoctorDocument`."""
    gen = _Generator()
    root = gen.typed_dict(DoctorDocument)
    name = root["$ref"].rsplit("/", 1)[1]
    document = gen.defs.pop(name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"kt doctor --json, schema version {DOCTOR_SCHEMA_VERSION}",
        **document,
        "$defs": dict(sorted(gen.defs.items())),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    text = json.dumps(generate(), indent=2) + "\n"
    if args:
        Path(args[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
