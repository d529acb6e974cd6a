"""The Responses API end to end: the openai SDK and the Agents SDK against the real stack and the
default model. Where content must be exact, greedy answers of known prompts or constrained decoding
(a forced call, a JSON schema) make it so; the rest asserts protocol behaviour that holds for any output.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest

from clients import EngineClient
from launcher.stack import Stack
from common import ANSWER, ASK_MAX_TOKENS, MODEL, QUESTION, lazy_module
from fake_engine import start_shim, stop_process

agents = lazy_module("agents")
pytestmark = pytest.mark.model


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> None:
    agents.set_tracing_disabled(True)  # no platform key: the Agents SDK must not try to export traces


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the weather in a city",
           "parameters": CITY, "strict": True}
TIME = {**WEATHER, "name": "get_time", "description": "Get the local time in a city"}
WEATHER_QUESTION = "What is the weather in Paris?"


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    forecast: str = pydantic.Field(max_length=60)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


def greedy(**params) -> dict:
    return {"model": MODEL, "temperature": 0, "max_output_tokens": ASK_MAX_TOKENS, **params}


def test_create_with_string_and_list_input(openai_client: openai.OpenAI) -> None:
    first = openai_client.responses.create(**greedy(input=QUESTION[0]["content"]))
    assert first.status == "completed" and first.output_text == ANSWER
    again = openai_client.responses.create(**greedy(input=[{"role": "user", "content": QUESTION[0]["content"]}]))
    assert again.output_text == ANSWER and again.output[0].content[0].type == "output_text"
    assert again.usage.input_tokens == first.usage.input_tokens > 0
    assert again.usage.output_tokens == first.usage.output_tokens > 0
    assert again.usage.output_tokens_details.reasoning_tokens == 0
    # A prompt past the first 64-token segment (prefix-cache hits end on segment boundaries: model/step.py).
    notes = " ".join(f"Note {i}: the harbour opens at dawn." for i in range(10))
    long_input = f"{notes}\n\n{QUESTION[0]['content']}"
    cold = openai_client.responses.create(**greedy(input=long_input))
    warm = openai_client.responses.create(**greedy(input=[{"role": "user", "content": long_input}]))
    assert cold.usage.input_tokens == warm.usage.input_tokens > 64
    assert warm.usage.input_tokens_details.cached_tokens >= 64, "the prefix cache holds the first request's prompt"


def test_stream_events_one_by_one(openai_client: openai.OpenAI) -> None:
    with openai_client.responses.stream(**greedy(input=QUESTION[0]["content"])) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    item_id = events[2].item.id
    assert all(e.item_id == item_id and e.output_index == 0 and e.content_index == 0 for e in events[3:-2])
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == final.output_text == ANSWER
    assert final.id == events[0].response.id and final.output[0].id == item_id


def test_parse_fills_a_pydantic_model(openai_client: openai.OpenAI) -> None:
    parsed = openai_client.responses.parse(**greedy(input="Name a big city and its country.", max_output_tokens=60),
                                           text_format=City)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)


def test_max_output_tokens_cuts_to_incomplete(openai_client: openai.OpenAI) -> None:
    whole = openai_client.responses.create(**greedy(input=QUESTION[0]["content"], max_output_tokens=3))
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 3
    events = list(openai_client.responses.create(**greedy(input=QUESTION[0]["content"], max_output_tokens=3),
                                                 stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == whole.output_text


def forced_call(client: openai.OpenAI, stream: bool, **params):
    request = greedy(input=WEATHER_QUESTION, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
                     max_output_tokens=40, **params)
    if not stream:
        return client.responses.create(**request)
    with client.responses.stream(**request) as events:
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.content_part.added" not in kinds
        return events.get_final_response()


@pytest.mark.parametrize("stream, chain", [(False, "replay"), (True, "previous_response_id")])
def test_a_function_tool_round_trip(openai_client: openai.OpenAI, stream: bool, chain: str) -> None:
    first = forced_call(openai_client, stream)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments)["city"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 22 C"}
    if chain == "replay":
        turn = {"input": [{"role": "user", "content": WEATHER_QUESTION}, call.model_dump(exclude_none=True), result]}
    else:
        turn = {"input": [result], "previous_response_id": first.id}
    second = openai_client.responses.create(**greedy(tools=[WEATHER], tool_choice="none", max_output_tokens=20, **turn))
    assert second.status in ("completed", "incomplete")
    assert [item.type for item in second.output] == ["message"] and second.output_text
    listed = openai_client.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in listed] == ["message", "function_call", "function_call_output"]
    assert listed[1].call_id == call.call_id


def test_tool_choice_required_and_two_calls_in_parallel(openai_client: openai.OpenAI) -> None:
    """A conversation that asked for both tools before: with parallel calls the next answer holds
    two calls (greedy), each a function_call item of its own."""
    earlier = [{"role": "user", "content": "What is the weather and the time in Rome?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
               {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": '{"city": "Rome"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "Rainy"},
               {"type": "function_call_output", "call_id": "call_2", "output": "10:00"},
               {"role": "assistant", "content": "Rainy, and it is 10:00 in Rome."},
               {"role": "user", "content": "What is the weather and the time in Paris?"}]
    answer = openai_client.responses.create(**greedy(input=earlier, tools=[WEATHER, TIME], tool_choice="required",
                                                     parallel_tool_calls=True, max_output_tokens=80))
    calls = [item for item in answer.output if item.type == "function_call"]
    assert len(calls) == 2 and len({c.call_id for c in calls}) == 2 and len({c.id for c in calls}) == 2
    assert {c.name for c in calls} <= {"get_weather", "get_time"}


def test_tool_choice_none_answers_in_text(openai_client: openai.OpenAI) -> None:
    answer = openai_client.responses.create(**greedy(input=WEATHER_QUESTION, tools=[WEATHER], tool_choice="none",
                                                     max_output_tokens=12))
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


# ------------------------------------------------------------------ the Agents SDK


def agents_model(stack: Stack) -> agents.OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
    return agents.OpenAIResponsesModel(model=MODEL, openai_client=client)


def weather_agent(stack: Stack, calls: list[str], output_type: type | None = None,
                  max_tokens: int = 60) -> agents.Agent:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        calls.append(city)
        return f"Sunny, 22 C in {city}" if output_type else f"Sunny in {city}."

    return agents.Agent(name="weather", instructions="You answer questions about the weather.",
                        model=agents_model(stack), tools=[get_weather], output_type=output_type,
                        model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                            max_tokens=max_tokens))


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_calls_a_tool_then_answers(stack: Stack, streamed: bool) -> None:
    """Turn one is a forced call (the SDK resets tool_choice after it); turn two answers with its result."""
    calls: list[str] = []
    agent = weather_agent(stack, calls)

    async def run() -> str:
        if not streamed:
            return (await agents.Runner.run(agent, WEATHER_QUESTION, max_turns=3)).final_output
        result = agents.Runner.run_streamed(agent, WEATHER_QUESTION, max_turns=3)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds
        return result.final_output

    output = asyncio.run(run())
    assert len(calls) == 1 and isinstance(output, str) and output


def test_agents_sdk_output_type_is_a_pydantic_model(stack: Stack) -> None:
    """The first turn carries the output schema with the forced call; after the tool's result the
    SDK resets the choice to auto, and the answer (json_schema "final_output") is typed."""
    calls: list[str] = []
    result = asyncio.run(agents.Runner.run(weather_agent(stack, calls, Weather, max_tokens=120), WEATHER_QUESTION,
                                           max_turns=4))
    assert calls == ["Paris"] and isinstance(result.final_output, Weather)


# ------------------------------------------------------------------ the store over a restart


def test_a_stored_response_survives_a_shim_restart(stack: Stack, tmp_path: Path) -> None:
    """A second shim on the session's engine, with its own store folder, started twice."""
    def shim() -> tuple:
        return start_shim(stack.engine_address, "--responses-store-dir", str(tmp_path))

    process, url = shim()
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            first = client.responses.create(**greedy(input=QUESTION[0]["content"]))
    finally:
        stop_process(process)
    process, url = shim()
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            assert client.responses.retrieve(first.id).output_text == ANSWER
            follow = client.responses.create(**greedy(input="And of Italy?", previous_response_id=first.id))
            assert follow.status in ("completed", "incomplete")
            assert [i.type for i in client.responses.input_items.list(follow.id, order="asc").data] == [
                "message", "message", "message"]
    finally:
        stop_process(process)


@pytest.fixture(autouse=True)
def _stack_alive(stack: Stack) -> Iterator[None]:
    yield
    stack.check_alive()


def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses(openai_client: openai.OpenAI) -> None:
    """A first turn longer than the context: a 400 naming the input, unless truncation is auto."""
    history = [{"role": "user", "content": "lighthouse " * 9000}, {"role": "assistant", "content": "Noted."},
               {"role": "user", "content": QUESTION[0]["content"]}]
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.responses.create(**greedy(input=history))
    assert raised.value.body["param"] == "input" and raised.value.body["code"] == "context_length_exceeded"
    answer = openai_client.responses.create(**greedy(input=history, truncation="auto"))
    assert answer.truncation == "auto" and answer.status in ("completed", "incomplete") and answer.output_text
    assert answer.usage.input_tokens < 100


def test_truncation_auto_counts_the_exact_prompt_with_tools_and_format_in_one_call(
        openai_client: openai.OpenAI, engine_client: EngineClient, stack: Stack) -> None:
    """The engine drops the oldest turns itself (GenerateRequest.drop_oldest_messages), counting the
    prompt it generates from: the tool prompt with its tool choice and answer format included (the
    shim once counted it without them, with a Tokenize call per dropped turn, and a prompt it
    judged to fit was refused). A call goes with its output; the instructions stay."""
    limit = engine_client.model_info().max_context_length
    history = [{"role": "user", "content": "lighthouse " * (limit + 100)},  # alone more than the context
               {"role": "assistant", "content": "Let me check."},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C."},
               {"role": "user", "content": "So, what should I wear in Paris today?"}]
    common = {"model": MODEL, "temperature": 0, "instructions": "You are a weather assistant.", "tools": [WEATHER],
              "parallel_tool_calls": False, "text": {"format": {"type": "json_schema", "name": "weather",
                                                             "schema": Weather.model_json_schema(), "strict": True}}}

    def prompt_tokens(items: list[dict]) -> int:  # as generated from, untruncated
        return openai_client.responses.create(**common, input=items, max_output_tokens=1).usage.input_tokens

    without_first, last_only = prompt_tokens(history[1:]), prompt_tokens(history[4:])
    # Exactly full: the prompt without the first turn and max_output_tokens fill the context.
    request_id = f"trunc-{uuid.uuid4().hex}"
    exact = openai_client.responses.create(**common, input=history, truncation="auto",
                                           max_output_tokens=limit - without_first,
                                           extra_headers={"x-request-id": request_id})
    assert exact.status == "completed" and exact.usage.input_tokens == without_first
    # One token more: the call and its output go too (together), the instructions stay.
    over = openai_client.responses.create(**common, input=history, truncation="auto",
                                          max_output_tokens=limit - without_first + 1)
    assert over.status == "completed" and over.usage.input_tokens == last_only
    # One engine call did it: a Generate, no Tokenize.
    lines = [line for line in stack.engine_log.read_text().splitlines() if f"[{request_id}]" in line]
    assert sum("generate:" in line for line in lines) == 1
    assert not [line for line in lines if "tokenize:" in line]
    assert [line for line in lines if "dropped the 1 oldest messages" in line]
    # Even the last turn alone does not fit: a 400 naming the input.
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.responses.create(**common, input=history, truncation="auto",
                                       max_output_tokens=limit - last_only + 1)
    assert raised.value.body["param"] == "input" and raised.value.body["code"] == "context_length_exceeded"
