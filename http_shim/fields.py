"""Readers of a JSON request body's fields: each returns the value, or raises the 400 that names
the field (the `param` a client sees) and says what was wrong. What the Messages and Responses parsers
read bodies with until they move onto typed requests (http_shim/protocol/), as the OpenAI API has."""

from __future__ import annotations

import json
from typing import Any

from conduit.v1.contract import Range

from .errors import invalid
from .limits import UINT32_MAX, RequestLimits
from .protocol.base import is_int, is_number


def int_field(body: dict, key: str, lo: int, hi: int, param: str | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    param = param or key
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise invalid(f"'{param}' must be an integer, got {json.dumps(value)}.", param)
    if not lo <= value <= hi:
        raise invalid(f"'{param}' must be between {lo} and {hi}, got {value}.", param)
    return value


def number_field(body: dict, key: str, allowed: Range) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise invalid(f"'{key}' must be a number, got {json.dumps(value)}.", key)
    if value not in allowed:
        low = f"greater than {allowed.lo}" if allowed.lo_open else f"at least {allowed.lo}"
        raise invalid(f"'{key}' must be {low} and at most {allowed.hi}, got {value}.", key)
    return float(value)


def bool_field(body: dict, key: str, param: str | None = None) -> bool | None:
    value = body.get(key)
    if value is None:
        return None
    param = param or key
    if not isinstance(value, bool):
        raise invalid(f"'{param}' must be a boolean, got {json.dumps(value)}.", param)
    return value


def str_value(value: Any, param: str, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise invalid(f"'{param}' must be a string.", param)
    if not allow_empty and not value:
        raise invalid(f"'{param}' must not be empty.", param)
    return value


def dict_value(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be an object.", param)
    return value


def list_value(value: Any, param: str, allow_empty: bool = False) -> list:
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array.", param)
    if not allow_empty and not value:
        raise invalid(f"'{param}' must not be empty.", param)
    return value


def model_field(body: dict) -> str:
    if body.get("model") is None:
        raise invalid("you must provide a model parameter.", "model")
    return str_value(body["model"], "model", allow_empty=False)


def max_tokens_field(body: dict, keys: tuple[str, ...], lo: int, limits: RequestLimits) -> int | None:
    """The first of `keys` that is set, within [lo, the operator's cap]."""
    for key in keys:
        value = int_field(body, key, lo, UINT32_MAX)
        if value is None:
            continue
        if limits.max_tokens is not None and value > limits.max_tokens:
            raise invalid(f"'{key}' may be at most {limits.max_tokens} on this server, got {value}.", key)
        return value
    return None


def schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise invalid(f"'{param}' is not valid JSON.", param) from None
    if not isinstance(schema, (dict, bool)):
        raise invalid(f"'{param}' must be a JSON Schema object.", param)
    return json.dumps(schema)
