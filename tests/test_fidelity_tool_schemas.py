"""JSON Schema features, as a forced tool's parameters and as `response_format` alike (issue 28):
whatever one accepts the other does. A served schema's output validates against it (jsonschema);
a schema the grammar engine cannot enforce is a 400 naming the parameter, with the engine's
reason and without the internal grammar text."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from common import MODEL

pytestmark = pytest.mark.model

NAME = {"type": "string", "maxLength": 12}
# Bounded: unbounded, the small model may write digits until max_tokens, as it did on an Intel Xeon and
# not on an AMD EPYC (greedy paths follow each CPU's rounding); the bounds end every number.
COORDINATE = {"type": "integer", "minimum": -1000, "maximum": 1000}
POINT = {"type": "object", "properties": {"x": COORDINATE, "y": COORDINATE}, "required": ["x", "y"]}


def obj(properties: dict, **extra) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), **extra}


SERVED = {
    "defs-and-refs": obj({"a": {"$ref": "#/$defs/P"}, "b": {"$ref": "#/$defs/Q"}},
                         **{"$defs": {"P": POINT, "Q": obj({"p": {"$ref": "#/$defs/P"}})}}),
    "definitions": obj({"p": {"$ref": "#/definitions/P"}}, definitions={"P": POINT}),
    "recursive": obj({"tree": {"$ref": "#/$defs/Node"}}, **{"$defs": {"Node": obj(
        {"name": NAME, "child": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}})}}),
    "recursive-root": obj({"name": NAME, "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}),
    "enum": obj({"color": {"enum": ["red", "green", "blue"]}}),
    "const": obj({"kind": {"const": "fruit"}}),
    "anyOf-nullable": obj({"name": {"anyOf": [NAME, {"type": "null"}]}}),
    "type-list": obj({"name": {"type": ["string", "null"], "maxLength": 12}}),
    "oneOf-discriminated": obj({"pet": {
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}},
        **{"$defs": {"Cat": obj({"kind": {"const": "cat"}, "name": NAME}),
                     "Dog": obj({"kind": {"const": "dog"}, "barks": {"type": "boolean"}})}}),
    "allOf": obj({"p": {"allOf": [{"$ref": "#/$defs/P"}, {"type": "object"}]}}, **{"$defs": {"P": POINT}}),
    "additionalProperties": obj({"scores": {"type": "object", "additionalProperties": {"type": "integer"},
                                            "maxProperties": 3}}),
    "formats": obj({"day": {"type": "string", "format": "date"}, "id": {"type": "string", "format": "uuid"},
                    "mail": {"type": "string", "format": "email", "maxLength": 30}}),
    "pattern-and-lengths": obj({"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                "tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}}),
    "numbers": obj({"n": {"type": "number", "minimum": 0, "exclusiveMaximum": 10},
                    "i": {"type": "integer", "minimum": 1, "maximum": 5}}),
    "prefixItems": obj({"pair": {"type": "array", "prefixItems": [{"type": "integer"}, NAME],
                                 "minItems": 2, "maxItems": 2}}),
    # What Pydantic v2 writes: $schema-less draft 2020-12 with titles, descriptions and defaults.
    "pydantic-annotations": {"title": "Order", "description": "An order.", "type": "object",
                             "properties": {"item": {"title": "Item", "description": "what", **NAME},
                                            "qty": {"title": "Qty", "type": "integer", "default": 1}},
                             "required": ["item"]},
    "draft-2020-12-marker": {"$schema": "https://json-schema.org/draft/2020-12/schema", **obj({"name": NAME})},
}

# Recursive schemas are served, but the small model tends to nest until max_tokens: a cut output
# must then show the recursion followed (a child inside a child), as only the resolved $ref allows.
RECURSIVE = {"recursive", "recursive-root"}
NESTED_CHILD = '"child": {"name": '
# Room for any answer here. The recursive ones use all they get, and 80 tokens hold two levels of
# nesting: with 200 each took 5-9 s in the suite.
MAX_TOKENS, RECURSIVE_MAX_TOKENS = 200, 80

REFUSED = {
    "unknown-ref": (obj({"p": {"$ref": "#/$defs/Missing"}}), "/$defs/Missing"),
    "uniqueItems": (obj({"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}), "uniqueItems"),
    "not": (obj({"name": {"not": {"type": "null"}}}), "not"),
    "if-then": ({"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "if"),
}


def as_tool(client: openai.OpenAI, schema: dict, max_tokens: int = MAX_TOKENS) -> tuple[str, str]:
    """(finish_reason, arguments) of a forced call to a tool with these parameters."""
    tools = [{"type": "function", "function": {"name": "record", "description": "Record the data.", "parameters": schema}}]
    choice = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Record some example data."}], tools=tools,
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=max_tokens).choices[0]
    return choice.finish_reason, choice.message.tool_calls[0].function.arguments if choice.message.tool_calls else ""


def as_format(client: openai.OpenAI, schema: dict, max_tokens: int = MAX_TOKENS) -> tuple[str, str]:
    """(finish_reason, content) of an answer in this response format."""
    choice = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give me some example data."}], temperature=0,
        max_tokens=max_tokens, response_format={"type": "json_schema", "json_schema": {"name": "data", "schema": schema}},
    ).choices[0]
    return choice.finish_reason, choice.message.content


WAYS = {"tool": (as_tool, "tool_calls", "tools[0].function.parameters"),
        "response_format": (as_format, "stop", "response_format")}


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", list(SERVED))
def test_served_schema_features_give_valid_output(openai_client: openai.OpenAI, case: str, way: str) -> None:
    ask, finish, _ = WAYS[way]
    got_finish, text = ask(openai_client, SERVED[case], RECURSIVE_MAX_TOKENS if case in RECURSIVE else MAX_TOKENS)
    if case in RECURSIVE and got_finish == "length":
        assert text.count(NESTED_CHILD) >= 2, text
        return
    assert got_finish == finish, text
    jsonschema.validate(json.loads(text), SERVED[case], format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", list(REFUSED))
def test_schemas_the_grammar_cannot_enforce_are_a_400_naming_the_parameter(
        openai_client: openai.OpenAI, case: str, way: str) -> None:
    ask, _, param = WAYS[way]
    schema, reason = REFUSED[case]
    with pytest.raises(openai.BadRequestError) as caught:
        ask(openai_client, schema)
    error = caught.value.body
    assert error["param"] == param
    assert reason in error["message"]
    assert "%json" not in error["message"] and "start:" not in error["message"], "no internal grammar text"
