"""Constrained decoding through the Python gRPC client: regex and JSON Schema."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from clients import EngineClient
from common import QUESTION, WEATHER_QUESTION

pytestmark = pytest.mark.model

PHONE = r"[0-9]{3}-[0-9]{4}"


def test_regex_constraint(engine_client: EngineClient) -> None:
    result = engine_client.complete(prompt="A phone number: ", temperature=0, max_tokens=20, regex=PHONE)
    assert re.fullmatch(PHONE, result.text), result.text
    assert result.choices[0].finish_reason == "stop"


def test_json_schema_constraint(engine_client: EngineClient) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    result = engine_client.complete(messages=QUESTION,
                                    temperature=0, max_tokens=60, json_schema=schema)
    jsonschema.validate(json.loads(result.text), schema)


def test_forced_tool_call(engine_client: EngineClient) -> None:
    weather = {"name": "get_weather", "description": "Current weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    result = engine_client.complete(messages=WEATHER_QUESTION,
                                    temperature=0, max_tokens=100, tools=[weather], tool_choice="get_weather",
                                    parallel_tool_calls=False)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [call.name for call in choice.tool_calls] == ["get_weather"]
    assert choice.tool_calls[0].id
    jsonschema.validate(json.loads(choice.tool_calls[0].arguments), weather["parameters"])
