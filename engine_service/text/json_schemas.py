"""JSON Schemas as the grammar engine gets them, whether they are a response format or a tool's
parameters: the same options, the same closing of objects, and local `$ref`s that still resolve
when a schema is placed inside another (a tool's parameters sit inside the call wrapper)."""

from __future__ import annotations

# Compact separators: small models otherwise wander into endless whitespace. Pydantic writes a
# discriminated union as `oneOf`; llguidance decodes overlapping `oneOf` branches as `anyOf`
# (output valid under one branch, which is what a discriminator already guarantees).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "coerce_one_of": True}

# Keywords whose value maps names to schemas (the map itself is not a schema).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_objects(schema: object) -> object:
    """The schema with `additionalProperties: false` wherever an object lists its properties and
    says nothing of others. Output valid under it is valid under the original, and small models
    otherwise invent keys until they run out of tokens."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value  # values, not schemas
        else:
            out[key] = closed_objects(value)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def placed_at(schema: object, pointer: str) -> object:
    """The schema with every local `$ref` ("#", "#/$defs/C", "#/definitions/C") rewritten to resolve
    from the root of a document that holds this schema at JSON pointer `pointer` ("/anyOf/0/...")."""
    if isinstance(schema, list):
        return [placed_at(item, pointer) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = "#" + pointer + value[1:]
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value
        else:
            out[key] = placed_at(value, pointer)
    return out
