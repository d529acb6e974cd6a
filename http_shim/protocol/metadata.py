"""`metadata`: up to 16 string values under short keys, as OpenAI bounds it (responses, vector stores)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema

from .base import fail

METADATA_MAX_KEYS, METADATA_MAX_KEY_CHARS, METADATA_MAX_VALUE_CHARS = 16, 64, 512  # OpenAI's limits


def _metadata(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise fail("'{param}' must be an object.")
    if len(value) > METADATA_MAX_KEYS:
        raise fail("'{param}' may hold at most {cap} keys, got {got}.", cap=METADATA_MAX_KEYS, got=len(value))
    if any(len(key) > METADATA_MAX_KEY_CHARS for key in value):
        raise fail("'{param}' keys may be at most {cap} characters.", cap=METADATA_MAX_KEY_CHARS)
    if not all(isinstance(v, str) and len(v) <= METADATA_MAX_VALUE_CHARS for v in value.values()):
        raise fail("'{param}' values must be strings of at most {cap} characters.", cap=METADATA_MAX_VALUE_CHARS)
    return value


Metadata = Annotated[dict[str, str], PlainValidator(_metadata), WithJsonSchema({
    "type": "object", "maxProperties": METADATA_MAX_KEYS,
    "additionalProperties": {"type": "string", "maxLength": METADATA_MAX_VALUE_CHARS}})]
