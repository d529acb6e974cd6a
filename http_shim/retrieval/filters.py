"""Attribute filters (checked in protocol.py) applied to a file's attributes, as OpenAI compares them:
`eq`/`ne` on equal types, `gt`... on numbers (or strings, compared as strings), `in`/`nin` on a list.
A file without the key never matches a comparison, `ne` and `nin` included."""

from __future__ import annotations

from typing import Any


def matches(attributes: dict[str, Any], condition: dict[str, Any]) -> bool:
    kind = condition["type"]
    if kind == "and":
        return all(matches(attributes, c) for c in condition["filters"])
    if kind == "or":
        return any(matches(attributes, c) for c in condition["filters"])
    if condition["key"] not in attributes:
        return False
    have, want = attributes[condition["key"]], condition["value"]
    if kind in ("in", "nin"):
        return (have in want) == (kind == "in")
    if kind in ("eq", "ne"):
        same = type(have) is type(want) or (_number(have) and _number(want))
        return (same and have == want) == (kind == "eq")
    if _number(have) != _number(want) or isinstance(have, bool):
        return False
    return {"gt": have > want, "gte": have >= want, "lt": have < want, "lte": have <= want}[kind]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
