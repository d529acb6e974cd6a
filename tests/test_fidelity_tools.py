"""Tool calling through the openai SDK: every tool_choice, parallel_tool_calls, streamed calls
(by hand and with the SDK's stream helper), and a follow-up turn with the tool's answer."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from common import MODEL, WEATHER_QUESTION, ask

pytestmark = pytest.mark.model

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",
                                      "parameters": CITY_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the local time in a city",
                                      "parameters": CITY_SCHEMA}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
# Room for a couple of calls: with parallel calls allowed the model may add a second one.
TOOL_MAX_TOKENS = 80


class GetWeather(pydantic.BaseModel):
    """Get the weather in a city."""

    city: str


def ask_tools(client: openai.OpenAI, **params: Any):
    """WEATHER_QUESTION with both TOOLS, greedy; `params` add or override fields."""
    return ask(client, **{"messages": WEATHER_QUESTION, "tools": TOOLS, "max_tokens": TOOL_MAX_TOKENS, **params})


def assert_valid_calls(calls: list[Any], names: set[str]) -> None:
    """Each call: an id, type function, a known name, JSON arguments valid against that tool's schema."""
    assert calls, "no tool calls"
    assert len({call.id for call in calls}) == len(calls), "tool call ids must be unique"
    for call in calls:
        assert call.id and call.type == "function"
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_tool_choice_none_never_calls(openai_client: openai.OpenAI) -> None:
    choice = ask_tools(openai_client, tool_choice="none", max_tokens=12).choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str) and choice.message.content


@pytest.mark.parametrize("messages", [WEATHER_QUESTION, [{"role": "user", "content": "Say hello."}]],
                         ids=["weather", "hello"])
def test_tool_choice_auto_has_the_right_shape(openai_client: openai.OpenAI, messages: list[dict]) -> None:
    choice = ask_tools(openai_client, messages=messages, tool_choice="auto").choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))
    else:
        assert choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str)


@pytest.mark.parametrize("tool_choice, names", [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
], ids=["required", "named"])
def test_forced_tool_calls(openai_client: openai.OpenAI, tool_choice: Any, names: set[str]) -> None:
    response = ask_tools(openai_client, tool_choice=tool_choice)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.role == "assistant"
    assert_valid_calls(choice.message.tool_calls, names)


def test_forced_calls_for_every_choice(openai_client: openai.OpenAI) -> None:
    response = ask_tools(openai_client, tool_choice="required", n=2, temperature=1, seed=3, parallel_tool_calls=False)
    assert [choice.index for choice in response.choices] == [0, 1]
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls"
        assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))
        assert len(choice.message.tool_calls) == 1


def test_parallel_tool_calls_false_gives_one_call(openai_client: openai.OpenAI) -> None:
    choice = ask_tools(openai_client, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))


def test_streamed_tool_call_deltas(openai_client: openai.OpenAI) -> None:
    """Accumulate delta.tool_calls the way hand-written clients do, and compare with the whole answer."""
    tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    whole = ask_tools(openai_client, tool_choice=tool_choice).choices[0].message.tool_calls
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in ask_tools(openai_client, tool_choice=tool_choice, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                assert isinstance(delta.index, int)
                if delta.index not in calls:  # the first delta of a call names it
                    assert delta.id and delta.type == "function" and delta.function.name
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
                else:
                    assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert sorted(calls) == list(range(len(calls)))
    # The fragments join into exactly the arguments string of the non-streamed answer.
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (call.function.name, call.function.arguments) for call in whole]
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_sdk_stream_helper_parses_tool_arguments(openai_client: openai.OpenAI) -> None:
    with openai_client.chat.completions.stream(
            model=MODEL, messages=WEATHER_QUESTION, tools=[openai.pydantic_function_tool(GetWeather)],
            tool_choice="required", parallel_tool_calls=False, temperature=0,
            max_tokens=TOOL_MAX_TOKENS) as stream:
        done = [event for event in stream if event.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [event.name for event in done] == ["GetWeather"]
    assert isinstance(done[0].parsed_arguments, GetWeather)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.parsed_arguments == done[0].parsed_arguments


@pytest.mark.parametrize("stream", [False, True])
def test_follow_up_turn_with_the_tool_result(openai_client: openai.OpenAI, stream: bool) -> None:
    first = ask_tools(openai_client, tool_choice="required", parallel_tool_calls=False).choices[0].message
    (call,) = first.tool_calls
    messages = [*WEATHER_QUESTION, first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 21})}]
    answer = openai_client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                                   temperature=0, max_tokens=20, stream=stream)
    if stream:
        chunks = list(answer)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
    else:
        text, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
    assert text and finish in ("stop", "length")


@pytest.mark.parametrize("max_tokens, calls", [(12, 0), (18, 1)], ids=["name-cut", "arguments-cut"])
def test_forced_call_cut_by_max_tokens_does_not_leak_markup(openai_client: openai.OpenAI, max_tokens: int,
                                                            calls: int) -> None:
    """As OpenAI does: finish_reason length, the partial call in tool_calls (left out while its name is
    incomplete), no markup as content."""
    choice = ask_tools(openai_client, tool_choice="required", max_tokens=max_tokens).choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.content
    assert [call.function.name for call in choice.message.tool_calls or []] == ["get_weather"] * calls
    for call in choice.message.tool_calls or []:
        assert '{"city": '.startswith(call.function.arguments[:9]) and "<" not in call.function.arguments
