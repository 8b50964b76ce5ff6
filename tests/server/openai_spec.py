"""OpenAI's published wire format as jsonschema validators.

The schemas are an extract of github.com/openai/openai-openapi (openapi.json, MIT; the commit and
licence are in tests/server/openai_schemas.json's `_source`). They are used as published, with one
translation: OpenAPI 3.0's `nullable: true`, which the file still uses in places although it says
3.1, is not a JSON Schema keyword, so it becomes the `anyOf [..., null]` it means.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SPEC_FILE = Path(__file__).with_name("openai_schemas.json")


def _nullable_to_anyof(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable_to_anyof(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_anyof(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@functools.cache
def _published() -> dict[str, Any]:
    doc = json.loads(SPEC_FILE.read_text())
    schemas: dict[str, Any] = _nullable_to_anyof(doc["components"]["schemas"])
    return schemas


def published_schemas() -> dict[str, Any]:
    """components.schemas, a fresh copy the caller may patch."""
    return copy.deepcopy(_published())


class Contract:
    """Validators for named component schemas; a failure lists the offending path and reason."""

    def __init__(self, schemas: dict[str, Any]) -> None:
        self.schemas = schemas
        self._validators: dict[str, Draft202012Validator] = {}
        # Each event of a Responses stream names its type; this maps it to its own schema.
        self.event_schema: dict[str, str] = {}
        for ref in schemas["ResponseStreamEvent"]["anyOf"]:
            name = ref["$ref"].rsplit("/", 1)[-1]
            for kind in schemas[name]["properties"]["type"]["enum"]:
                self.event_schema[kind] = name

    def validator(self, name: str) -> Draft202012Validator:
        if name not in self._validators:
            root = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": self.schemas}}
            self._validators[name] = Draft202012Validator(root)
        return self._validators[name]

    def check(self, name: str, body: Any) -> None:
        errors = list(self.validator(name).iter_errors(body))
        if errors:
            worst = best_match(errors)
            where = "/".join(str(p) for p in worst.absolute_path) or "(root)"
            raise AssertionError(f"{name} at {where}: {worst.message}\n{len(errors)} error(s) in "
                                 f"{json.dumps(body)[:2000]}")

    def check_event(self, event: dict[str, Any]) -> None:
        assert event.get("type") in self.event_schema, f"unknown Responses event type {event.get('type')!r}"
        self.check(self.event_schema[event["type"]], event)
