"""LiteLLM's OpenAI-compatible provider against the running stack, streaming and not."""

from __future__ import annotations

import json
import os

import pytest

from launcher.stack import Stack
from common import MODEL, QUESTION, WEATHER_QUESTION

pytestmark = pytest.mark.model

LITELLM_MODEL = f"openai/{MODEL}"  # the model through LiteLLM's OpenAI-compatible provider


def complete(stack: Stack, **params):
    # Imported here, not at collection: litellm takes ~3 s to import, which the fast tier should not pay.
    # Its bundled model price map, instead of fetching one from the network at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    request = {"model": LITELLM_MODEL, "api_base": stack.base_url, "api_key": "unused", "messages": QUESTION,
               "temperature": 0, "max_tokens": 20, "num_retries": 0, "timeout": 120, **params}
    return litellm.completion(**request)


def test_completion(stack: Stack) -> None:
    response = complete(stack)
    assert "Paris" in response.choices[0].message.content
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens > 0


def test_streaming_equals_non_streaming(stack: Stack) -> None:
    whole = complete(stack).choices[0].message.content
    chunks = list(complete(stack, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_forced_tool_call(stack: Stack) -> None:
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    response = complete(stack, messages=WEATHER_QUESTION,
                        tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=40)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
