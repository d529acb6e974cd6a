"""Forced tool calls over many seeds (issue 7), through the openai SDK: with `required` and with a
named function, streamed and not, and a max_tokens that cuts some answers mid-call. Every complete
call parses and matches its schema, no tool-call markup leaks into arguments or content, and a
call cut by max_tokens is only ever the last one, with finish_reason "length"."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest

from benchmarks.forced_tool_calls import collect_stream
from common import MODEL, WEATHER_QUESTION

pytestmark = pytest.mark.model

# A JavaScript agent framework's own schema for the tool, `$schema` and all.
SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "weather for a city",
                                          "parameters": SCHEMA}}]
MARKUP = ("<tool_call>", "</tool_call>", "<|im_end|>")
SEEDS = range(16)
# A whole call is about 26 tokens: the short limits cut it at different places, 80 leaves room.
MAX_TOKENS = (14, 20, 24, 80)


def answer(client: openai.OpenAI, seed: int, tool_choice: Any, stream: bool) -> tuple[str, list[dict], str]:
    request = dict(model=MODEL, messages=WEATHER_QUESTION, tools=TOOLS, tool_choice=tool_choice, seed=seed,
                   max_tokens=MAX_TOKENS[seed % len(MAX_TOKENS)])
    if stream:
        return collect_stream(client.chat.completions.create(stream=True, **request))
    choice = client.chat.completions.create(**request).choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, choice.finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "weather"}}],
                         ids=["required", "named"])
def test_forced_calls_over_seeds_parse_and_never_carry_markup(openai_client: openai.OpenAI, tool_choice: Any,
                                                              stream: bool) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda seed: answer(openai_client, seed, tool_choice, stream), SEEDS))
    finishes = set()
    for seed, (content, calls, finish) in zip(SEEDS, answers):
        finishes.add(finish)
        where = f"seed {seed}: {content!r} {calls} {finish}"
        assert not content, where  # forced calls are never content
        assert finish in ("tool_calls", "length"), where
        complete = calls[:-1] if finish == "length" else calls
        if finish == "tool_calls":
            assert calls, where
        for call in calls:
            assert call["name"] == "weather", where
            assert not any(tag in call["arguments"] for tag in MARKUP), where
        for call in complete:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMA)
    assert finishes == {"tool_calls", "length"}, "max_tokens should cut some answers and spare others"
