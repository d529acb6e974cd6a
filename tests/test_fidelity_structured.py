"""Structured output through the openai SDK: json_object, strict json_schema, `parse()`, vendor regex.

The default model is tiny; only constrained decoding makes these outputs parse and validate.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from common import MODEL, streamed_texts

pytestmark = pytest.mark.model

CAT_PROMPT = [{"role": "user", "content": "Describe a cat as a JSON object with its name, age and color."}]
CAT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "color": {"type": "string", "enum": ["black", "white", "orange"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
CAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT_SCHEMA, "strict": True}}
CAT_FORMAT_NOT_STRICT = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT_SCHEMA}}


class Cat(pydantic.BaseModel):
    name: str
    age: int


def test_json_object_output_parses(openai_client: openai.OpenAI) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a JSON object describing a cat with name and age."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


def test_json_schema_strict_validates_for_every_choice(openai_client: openai.OpenAI) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL, messages=CAT_PROMPT, response_format=CAT_FORMAT, n=2, temperature=1, seed=7, max_tokens=80)
    assert [choice.index for choice in response.choices] == [0, 1]
    for choice in response.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), CAT_SCHEMA)


def test_json_schema_streamed_matches_non_streamed(openai_client: openai.OpenAI) -> None:
    # Without `strict` the schema is enforced all the same.
    params = dict(model=MODEL, messages=CAT_PROMPT, response_format=CAT_FORMAT_NOT_STRICT, temperature=0,
                  max_tokens=80)
    whole = openai_client.chat.completions.create(**params).choices[0].message.content
    texts, finishes = streamed_texts(openai_client.chat.completions.create(**params, stream=True, n=2))
    assert finishes == {0: "stop", 1: "stop"}
    for text in texts.values():
        jsonschema.validate(json.loads(text), CAT_SCHEMA)
        assert text == whole


def test_parse_returns_a_pydantic_object(openai_client: openai.OpenAI) -> None:
    completion = openai_client.chat.completions.parse(
        model=MODEL, messages=CAT_PROMPT, response_format=Cat, temperature=0, max_tokens=60)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Cat)
    assert message.parsed == Cat.model_validate_json(message.content)


def test_stream_helper_parses_the_final_message(openai_client: openai.OpenAI) -> None:
    with openai_client.chat.completions.stream(
            model=MODEL, messages=CAT_PROMPT, response_format=Cat, temperature=0, max_tokens=60) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert isinstance(message.parsed, Cat)
    assert "".join(deltas) == message.content


def test_vendor_regex_constrains_the_output(openai_client: openai.OpenAI) -> None:
    pattern = r"(yes|no), [0-9]{1,3} apples"
    response = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Do you like apples? How many?"}],
        extra_body={"structured_outputs": {"regex": pattern}}, temperature=0, max_tokens=20)
    assert re.fullmatch(pattern, response.choices[0].message.content)
    assert response.choices[0].finish_reason == "stop"


def test_vendor_regex_on_completions(openai_client: openai.OpenAI) -> None:
    pattern = r" [A-Z][a-z]{2,12}\."
    response = openai_client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=10, temperature=0,
        extra_body={"structured_outputs": {"regex": pattern}})
    assert re.fullmatch(pattern, response.choices[0].text)
