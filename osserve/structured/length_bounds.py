"""A JSON schema's string `maxLength`s, taken out of the grammar and enforced beside it.

llguidance compiles `{"type": "string", "maxLength": 40}` into one lexeme that counts characters,
and masks over such a lexeme are slow near its bound: with fewer than ~10 characters left no
precomputed token set ("slice") applies, and the mask walks the vocabulary's whole token trie
(1.4-1.7 ms a token on the CPU against ~10 us elsewhere; benchmarks/diag/mask_by_token.py; xgrammar's
issues #852 and #465 report the same cliff). At serving load those rows made the host the
bottleneck (bench_structured's schema, 256 rows: masks 7.5 ms a step against 3.0 without the
bound).

So where a schema is simple enough to follow byte by byte (the keywords in FOLLOWED: objects,
arrays, scalars, local $refs; no anyOf / oneOf / allOf / not / conditionals, whose branches a
cursor could not tell apart), `split` drops the maxLength of every plain string (no pattern,
format, enum or const: those stay regexes, bound included) and keeps the original for
json_cursor.py, which counts each such string's characters as the answer is written and masks the
tokens that would overflow. The grammar without the bounds accepts everything the schema does
and more; the cursor takes away exactly the difference (tests/structured/test_length_bounds.py
compares the masks with llguidance's own over random walks).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Keywords whose values are schemas the cursor follows, and those that only constrain a scalar or
# annotate. Any other keyword anywhere in the schema leaves the bounds in the grammar.
SCHEMA_VALUED = {"properties", "items", "prefixItems", "additionalProperties", "$defs", "definitions"}
PLAIN = {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
         "minLength", "maxLength", "pattern", "format", "minItems", "maxItems", "minProperties", "maxProperties",
         "required", "title", "description", "default", "examples", "$schema", "$id", "$comment", "x-guidance",
         "deprecated", "readOnly", "writeOnly", "$ref"}
FOLLOWED = SCHEMA_VALUED | PLAIN
MAX_DEPTH = 64  # deeper schemas keep their bounds in the grammar


@dataclass(frozen=True)
class LengthBounds:
    """`schema` as the request gave it (what json_cursor.py navigates); `unbounded` the same with
    every stripped bound gone (what the fast grammar compiles); `smallest` the smallest of them."""

    schema: dict[str, Any]
    unbounded: dict[str, Any]
    smallest: int


def stripped_bound(node: Any) -> int | None:
    """The maxLength this node's strings lose to `split` (None: it keeps any it has)."""
    if not isinstance(node, dict) or "maxLength" not in node:
        return None
    types = node.get("type")
    is_string = types == "string" or (isinstance(types, list) and "string" in types)
    if not is_string or any(k in node for k in ("pattern", "format", "enum", "const")):
        return None
    bound = node["maxLength"]
    return bound if isinstance(bound, int) and not isinstance(bound, bool) and bound >= 0 else None


def split(schema: dict[str, Any]) -> LengthBounds | None:
    """The schema's bounds taken out, or None: none to take, or a schema the cursor cannot follow."""
    bounds: list[int] = []
    if not _followable(schema, 0, bounds):
        return None
    if not bounds:
        return None
    unbounded = copy.deepcopy(schema)
    _strip(unbounded)
    return LengthBounds(schema, unbounded, min(bounds))


def _children(node: dict[str, Any]) -> Iterator[Any]:
    """The schemas a node holds under the keywords the cursor follows (SCHEMA_VALUED)."""
    for key in ("properties", "$defs", "definitions"):
        yield from node.get(key, {}).values()
    for key in ("items", "additionalProperties"):
        if key in node:
            yield node[key]
    yield from node.get("prefixItems", [])


def _followable(node: Any, depth: int, bounds: list[int]) -> bool:
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict) or depth > MAX_DEPTH or not set(node) <= FOLLOWED:
        return False
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")
                            or set(node) - {"$ref", "title", "description", "$comment"}):
        return False  # a remote $ref, or one with siblings (they would apply as allOf does)
    if not all(isinstance(node.get(key, {}), dict) for key in ("properties", "$defs", "definitions")) \
            or not isinstance(node.get("prefixItems", []), list):
        return False
    bound = stripped_bound(node)
    if bound is not None:
        bounds.append(bound)
    return all(_followable(child, depth + 1, bounds) for child in _children(node))


def _strip(node: Any) -> None:
    if not isinstance(node, dict):
        return
    if stripped_bound(node) is not None:
        del node["maxLength"]
    for child in _children(node):
        _strip(child)


def resolve(root: dict[str, Any], node: Any) -> Any:
    """Follow local $refs ("#", "#/$defs/x", JSON pointers) to the schema they name (a bad one: any
    value, which only loses the cursor's bound there: the grammar rejected such schemas already)."""
    for _ in range(MAX_DEPTH):
        if not isinstance(node, dict) or "$ref" not in node:
            return node
        target: Any = root
        for part in node["$ref"].lstrip("#").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return True
        node = target
    return True


def property_schema(root: dict[str, Any], obj: Any, key: str) -> Any:
    """The schema of key's value in an object of schema `obj`."""
    obj = resolve(root, obj)
    if not isinstance(obj, dict):
        return True
    properties = obj.get("properties", {})
    if key in properties:
        return resolve(root, properties[key])
    return resolve(root, obj.get("additionalProperties", True))


def item_schema(root: dict[str, Any], array: Any, index: int) -> Any:
    """The schema of item `index` of an array of schema `array`."""
    array = resolve(root, array)
    if not isinstance(array, dict):
        return True
    prefix = array.get("prefixItems", [])
    if index < len(prefix):
        return resolve(root, prefix[index])
    return resolve(root, array.get("items", True))
