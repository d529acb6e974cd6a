"""Cursor pages, as OpenAI's list endpoints (files, vector stores, their files) take and answer them:
`?after=ID&limit=N&order=asc|desc` -> {"object": "list", "data", "first_id", "last_id", "has_more"}."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .base import ApiModel, Str, int_in, one_of

ASCII_INTEGER = re.compile(r"-?[0-9]+")


class ListQuery(ApiModel):
    """The query of a list endpoint. `after` names an item of the same list (another tenant's or an
    unknown id gives an empty page, never a hint that it exists)."""

    after: Str | None = None
    before: Str | None = None
    limit: int_in(1, 100) = 20
    order: one_of("asc", "desc") = "desc"


def query_values(args: Mapping[str, str], integers: tuple[str, ...] = ("limit",)) -> dict[str, Any]:
    """A query string's values as a body would send them: digit strings of `integers` as numbers (other
    strings stay strings, so the check names them)."""
    values: dict[str, Any] = dict(args.items())
    for name in integers:
        text = values.get(name)
        if isinstance(text, str) and ASCII_INTEGER.fullmatch(text):  # not isdigit(): "²" is a digit to it
            values[name] = int(text)
    return values


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
