"""Anthropic's Messages API end to end: the real anthropic SDK against the real stack and default
model. Content is asserted only where it is certain: the greedy answer to QUESTION, and what
constrained decoding enforces (forced tool calls, a json_schema format); everything else checks the
protocol, which holds for any output."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pydantic
import pytest

from launcher.stack import Stack
from common import ANSWER, ASK_MAX_TOKENS, MODEL, QUESTION, lazy_module

anthropic = lazy_module("anthropic")

pytestmark = pytest.mark.model

GREEDY = {"extra_body": {"temperature": 0}}  # newer SDKs take sampling knobs only in the body
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}
WEATHER_TOOL = {"name": "get_weather", "description": "Get the weather in a city", "input_schema": WEATHER_SCHEMA}
TIME_TOOL = {"name": "get_time", "description": "Get the time in a city", "input_schema": WEATHER_SCHEMA}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
# A system prompt of many cache blocks: the engine's prefix cache serves its second use.
LONG_SYSTEM = " ".join(f"Rule {i}: answer politely, briefly and truthfully." for i in range(40))


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    sunny: bool


@pytest.fixture(scope="module")
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.shim_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


RAW_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
              "message_stop", "ping"}  # a MessageStream also yields its own derived events


def check_event_order(events: list) -> None:
    """message_start; per block start, deltas and stop with one index, blocks numbered from 0;
    message_delta; message_stop last; pings anywhere."""
    names = [e.type for e in events if e.type != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    open_index, next_index = None, 0
    for event in events[1:-2]:
        if event.type == "content_block_start":
            assert open_index is None and event.index == next_index
            open_index, next_index = event.index, next_index + 1
        elif event.type in ("content_block_delta", "content_block_stop"):
            assert event.index == open_index
            if event.type == "content_block_stop":
                open_index = None
        else:
            assert event.type == "ping", event
    assert open_index is None


# ------------------------------------------------------------------ create


def test_string_and_block_content_give_the_greedy_answer(claude):
    as_string = claude.messages.create(model=MODEL, max_tokens=ASK_MAX_TOKENS, messages=QUESTION, **GREEDY)
    as_blocks = claude.messages.create(
        model=MODEL, max_tokens=ASK_MAX_TOKENS, **GREEDY,
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION[0]["content"]}]}])
    assert text_of(as_string) == text_of(as_blocks) == ANSWER
    assert as_string.stop_reason == "end_turn" and as_string.stop_sequence is None
    assert as_string.id.startswith("msg_") and as_string.model == MODEL
    assert as_string.usage.output_tokens > 0 and as_string.usage.input_tokens > 0


def test_system_prompt_stop_sequences_and_max_tokens(claude, engine_client):
    system = "Answer in French."
    with_system = claude.messages.create(model=MODEL, max_tokens=5, messages=QUESTION, system=system, **GREEDY)
    rendered = engine_client.tokenize(messages=[{"role": "system", "content": system}, *QUESTION])
    usage = with_system.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(rendered.token_ids)
    stopped = claude.messages.create(model=MODEL, max_tokens=ASK_MAX_TOKENS, messages=QUESTION,
                                     stop_sequences=["Paris", "Berlin"], **GREEDY)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "Paris")
    assert text_of(stopped) == ANSWER[: ANSWER.index("Paris")]
    cut = claude.messages.create(model=MODEL, max_tokens=3, messages=QUESTION, **GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


# ------------------------------------------------------------------ streams


def test_stream_text_adds_up_to_the_final_message(claude):
    with claude.messages.stream(model=MODEL, max_tokens=ASK_MAX_TOKENS, messages=QUESTION, **GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text_of(final) == ANSWER and len(pieces) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0

    events = list(claude.messages.create(model=MODEL, max_tokens=ASK_MAX_TOKENS, messages=QUESTION, stream=True,
                                         **GREEDY))
    check_event_order(events)
    assert events[0].message.usage.input_tokens + events[0].message.usage.cache_read_input_tokens > 0
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == ANSWER
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens > 0


# ------------------------------------------------------------------ tools


def test_forced_tool_call_by_name_whole_and_streamed_agree(claude):
    params = {"model": MODEL, "max_tokens": 60, "messages": WEATHER_QUESTION, "tools": [WEATHER_TOOL, TIME_TOOL],
              "tool_choice": {"type": "tool", "name": "get_weather"}, **GREEDY}
    whole = claude.messages.create(**params)
    assert whole.stop_reason == "tool_use"
    [call] = [b for b in whole.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_SCHEMA)

    with claude.messages.stream(**params) as stream:
        events = [e for e in stream if e.type in RAW_EVENTS]
        final = stream.get_final_message()
    check_event_order(events)
    starts = {e.index: e.content_block for e in events if e.type == "content_block_start"}
    [tool_index] = [i for i, block in starts.items() if block.type == "tool_use"]
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.index == tool_index)
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert json.loads(partial) == streamed.input == call.input  # greedy: the same call as the whole answer
    assert starts[tool_index].name == "get_weather" and streamed.id == starts[tool_index].id
    assert events[-2].delta.stop_reason == final.stop_reason == "tool_use"


def test_tool_round_trip_with_any(claude):
    called = claude.messages.create(model=MODEL, max_tokens=60, messages=WEATHER_QUESTION,
                                    tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "any"}, **GREEDY)
    assert called.stop_reason == "tool_use"
    [call] = [b for b in called.content if b.type == "tool_use"]
    assert call.name in ("get_weather", "get_time")
    jsonschema.validate(call.input, WEATHER_SCHEMA)

    answered = claude.messages.create(
        model=MODEL, max_tokens=10, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "none"}, **GREEDY,
        messages=[*WEATHER_QUESTION, {"role": "assistant", "content": called.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "Sunny, 25 degrees"}]}])
    assert answered.stop_reason in ("end_turn", "max_tokens") and text_of(answered)
    assert not [b for b in answered.content if b.type == "tool_use"]


# ------------------------------------------------------------------ count_tokens, structured output, cache


def test_count_tokens_equals_the_input_tokens_of_the_same_request(claude):
    requests = [
        {"messages": QUESTION, "system": "Be brief."},
        # Tools on auto beside a format: the tool prompt names the format.
        {"messages": WEATHER_QUESTION, "tools": [WEATHER_TOOL],
         "output_config": {"format": {"type": "json_schema", "schema": Weather.model_json_schema()}}},
    ]
    for params in requests:
        counted = claude.messages.count_tokens(model=MODEL, **params).input_tokens
        usage = claude.messages.create(model=MODEL, max_tokens=1, **params).usage
        assert counted == usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_parse_returns_the_pydantic_model_whole_and_streamed(claude):
    params = {"model": MODEL, "max_tokens": 80, "output_format": Weather, **GREEDY,
              "messages": [{"role": "user", "content": "Is it sunny in Rome? Answer as JSON."}]}
    parsed = claude.messages.parse(**params)
    assert isinstance(parsed.parsed_output, Weather) and parsed.stop_reason == "end_turn"
    with claude.messages.stream(**params) as stream:
        final = stream.get_final_message()
    assert isinstance(final.parsed_output, Weather) and final.parsed_output == parsed.parsed_output


def test_a_repeated_long_system_prompt_reads_the_cache(claude):
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = claude.messages.create(model=MODEL, max_tokens=1, system=system, messages=QUESTION)
    second = claude.messages.create(model=MODEL, max_tokens=1, system=system,
                                    messages=[{"role": "user", "content": "And of Italy?"}])
    assert second.usage.cache_read_input_tokens > 0
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens > second.usage.cache_read_input_tokens
