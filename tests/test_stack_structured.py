"""Structured output through the openai SDK: response_format JSON (schema) and tool calls.

The engine enforces these with constrained decoding, so even the 135M default model must comply.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
CITY_SCHEMA = {
    "type": "object",
    # Bounds keep a 135M model from rambling inside a value until max_tokens.
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                 "parameters": WEATHER_PARAMS}}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

pytestmark = pytest.mark.model


def test_json_schema_response_format(openai_client: openai.OpenAI) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=100,
        messages=[{"role": "user", "content": "Give the capital of France and its population as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}})
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content), CITY_SCHEMA)


def test_json_object_response_format(openai_client: openai.OpenAI) -> None:
    question = 'What is the capital of France? Answer in JSON with the key "capital".'
    response = openai_client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=200, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": question}])
    assert response.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_required_tool_call(openai_client: openai.OpenAI) -> None:
    response = openai_client.chat.completions.create(model=MODEL, temperature=0, max_tokens=100,
                                                     messages=WEATHER_QUESTION, tools=[WEATHER_TOOL],
                                                     tool_choice="required")
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_single_tool_call_when_parallel_calls_are_off(openai_client: openai.OpenAI) -> None:
    response = openai_client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=100, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    assert response.choices[0].finish_reason == "tool_calls"
    assert [call.function.name for call in response.choices[0].message.tool_calls] == ["get_weather"]


def test_streamed_tool_calls_match_non_streamed(openai_client: openai.OpenAI) -> None:
    params = {"model": MODEL, "temperature": 0, "max_tokens": 100, "messages": WEATHER_QUESTION,
              "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole = openai_client.chat.completions.create(**params).choices[0].message.tool_calls
    chunks = list(openai_client.chat.completions.create(stream=True, **params))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    streamed: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                streamed.setdefault(delta.index, []).append(delta)
    assert sorted(streamed) == list(range(len(whole)))
    for index, call in enumerate(whole):
        first, *rest = streamed[index]
        # OpenAI's streaming shape: id, type and name in a call's first delta, then argument fragments.
        assert first.id and first.type == "function" and first.function.name == call.function.name
        assert all(not delta.id and not (delta.function and delta.function.name) for delta in rest)
        assert "".join(delta.function.arguments or "" for delta in streamed[index]) == call.function.arguments
