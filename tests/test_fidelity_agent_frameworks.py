"""Agent frameworks' default paths where tools meet structured output (issue 28), through the real
frameworks against the real stack and default model:

- a nested Pydantic model with an enum (its schema has `$defs` and `$ref`s) as a forced tool's
  arguments: instructor's default (tools) mode, pydantic-ai's default tool output, the openai SDK's
  own tool helper and an Agents SDK tool taking that model, whole and streamed;
- the Agents SDK's `output_type` beside a `@function_tool`: with `tool_choice="required"` it calls the
  tool and then returns the typed final output; on auto the final output is typed too;
- on the chat route, `response_format` beside tools on auto: the same conversation that calls
  a tool without a format still calls it with one, and after the tool's result the answer
  follows the format (whole and streamed); with a forced call the format is accepted.
"""

from __future__ import annotations

import asyncio
import enum
import json
import instructor
import jsonschema
import openai
import pydantic
import pytest

from launcher.stack import Stack
from common import MODEL, lazy_module

agents = lazy_module("agents")
pydantic_ai = lazy_module("pydantic_ai")
pydantic_ai_models = lazy_module("pydantic_ai.models.openai")
pydantic_ai_providers = lazy_module("pydantic_ai.providers.openai")

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> None:
    agents.set_tracing_disabled(True)  # no platform key: the Agents SDK must not try to export traces


BASKET_REQUEST = "Put three red apples in the basket."


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Fruit(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    color: Color


class Basket(pydantic.BaseModel):
    fruit: Fruit
    count: int


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    forecast: str = pydantic.Field(max_length=60)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}
WEATHER_FORMAT = {"type": "json_schema", "json_schema": {"name": "final_output", "strict": True,
                                                         "schema": Weather.model_json_schema()}}
# A conversation whose next turn the model greedily spends on a call (it follows the two before).
ANOTHER_CITY = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Rainy"},
    {"role": "assistant", "content": "Rainy in Rome."},
    {"role": "user", "content": "What is the weather in London?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "London"}'}}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "Foggy"},
    {"role": "assistant", "content": "Foggy in London."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def with_result(messages: list[dict], city: str, result: str) -> list[dict]:
    """`messages`, then a get_weather call for `city` and its result."""
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
    return [*messages, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_9", "content": result}]


def test_the_nested_schema_has_defs_refs_and_an_enum() -> None:
    schema = json.dumps(Basket.model_json_schema())
    assert '"$defs"' in schema and '"$ref": "#/$defs/Fruit"' in schema and '"enum"' in schema


@pytest.fixture(scope="module")
def instructor_client(stack: Stack) -> instructor.Instructor:
    return instructor.from_openai(openai.OpenAI(base_url=stack.base_url, api_key="unused"))


def test_instructor_default_mode_fills_a_nested_model(instructor_client: instructor.Instructor) -> None:
    basket = instructor_client.chat.completions.create(
        model=MODEL, response_model=Basket, messages=[{"role": "user", "content": BASKET_REQUEST}],
        temperature=0, max_tokens=100, max_retries=0)
    assert isinstance(basket, Basket) and isinstance(basket.fruit.color, Color)


def test_instructor_streams_a_nested_model(instructor_client: instructor.Instructor) -> None:
    # strict=False: instructor's final check of a partial stream validates the decoded dict in
    # strict mode, which refuses any enum's string (its bug: the same JSON validates whole).
    partials = list(instructor_client.chat.completions.create_partial(
        model=MODEL, response_model=Basket, messages=[{"role": "user", "content": BASKET_REQUEST}],
        temperature=0, max_tokens=100, max_retries=0, strict=False))
    assert len(partials) > 3, "the arguments should arrive in pieces"
    Basket.model_validate(partials[-1].model_dump())


def pydantic_agent(stack: Stack) -> pydantic_ai.Agent:
    """pydantic-ai's default output mode: the output type is a tool the model must call. (One per
    test: its async client belongs to the event loop it first ran in.)"""
    provider = pydantic_ai_providers.OpenAIProvider(base_url=stack.base_url, api_key="unused")
    model = pydantic_ai_models.OpenAIChatModel(MODEL, provider=provider)
    return pydantic_ai.Agent(model, output_type=Basket, model_settings={"temperature": 0, "max_tokens": 100})


def test_pydantic_ai_output_type_is_a_nested_model(stack: Stack) -> None:
    assert isinstance(pydantic_agent(stack).run_sync(BASKET_REQUEST).output, Basket)


def test_pydantic_ai_streams_a_nested_model(stack: Stack) -> None:
    async def run() -> list[Basket]:
        async with pydantic_agent(stack).run_stream(BASKET_REQUEST) as result:
            return [output async for output in result.stream_output()]

    outputs = asyncio.run(run())
    assert outputs and isinstance(outputs[-1], Basket)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_sdk_forced_call_with_a_nested_model(openai_client: openai.OpenAI, stream: bool) -> None:
    request = dict(model=MODEL, messages=[{"role": "user", "content": BASKET_REQUEST}], temperature=0,
                   max_tokens=100, tools=[openai.pydantic_function_tool(Basket)], tool_choice="required")
    if stream:
        with openai_client.chat.completions.stream(**request) as events:
            done = [event for event in events if event.type == "tool_calls.function.arguments.done"]
        assert [type(event.parsed_arguments) for event in done] == [Basket]
    else:
        (call,) = openai_client.chat.completions.parse(**request).choices[0].message.tool_calls
        assert isinstance(call.function.parsed_arguments, Basket)


def agents_model(stack: Stack) -> agents.OpenAIChatCompletionsModel:
    """The Agents SDK on chat completions (one per test, as its async client is bound to a loop)."""
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused")
    return agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)


def weather_agent(model: agents.OpenAIChatCompletionsModel, calls: list[str],
                  tool_choice: str | None) -> agents.Agent:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        calls.append(city)
        return f"Sunny, 22 C in {city}"

    return agents.Agent(name="weather", instructions="You answer questions about the weather.", model=model,
                        tools=[get_weather], output_type=Weather,
                        model_settings=agents.ModelSettings(tool_choice=tool_choice, temperature=0, max_tokens=120))


def test_agents_sdk_output_type_with_a_required_tool_calls_it_then_answers_typed(stack: Stack) -> None:
    """The request of the first turn carries the output schema with tool_choice "required" (a 400
    before); after the tool's result the SDK resets the choice to auto, and the answer is typed."""
    calls: list[str] = []
    result = asyncio.run(agents.Runner.run(weather_agent(agents_model(stack), calls, "required"),
                                    "What is the weather in Paris?", max_turns=4))
    assert calls == ["Paris"]
    assert isinstance(result.final_output, Weather)


def test_agents_sdk_output_type_on_auto_is_typed(stack: Stack) -> None:
    result = asyncio.run(agents.Runner.run(weather_agent(agents_model(stack), [], None),
                                    "What is the weather in Paris?", max_turns=4))
    assert isinstance(result.final_output, Weather)


def test_agents_sdk_tool_taking_a_nested_model(stack: Stack) -> None:
    baskets: list[Basket] = []

    @agents.function_tool
    def add_to_basket(basket: Basket) -> str:
        """Put fruit in the basket."""
        baskets.append(basket)
        return "done"

    agent = agents.Agent(name="grocer", model=agents_model(stack), tools=[add_to_basket],
                         tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=100))
    result = asyncio.run(agents.Runner.run(agent, BASKET_REQUEST, max_turns=2))
    assert len(baskets) == 1 and isinstance(baskets[0].fruit.color, Color)
    assert result.final_output == "done"


def chat(client: openai.OpenAI, messages: list[dict], stream: bool, **params) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of one greedy answer with WEATHER_TOOL."""
    request = dict(model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=80, **params)
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content or "", calls, choice.finish_reason
    content, pieces, finish = "", {}, ""
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            name, arguments = pieces.get(piece.index, ("", ""))
            pieces[piece.index] = (name or piece.function.name or "", arguments + (piece.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return content, [pieces[k] for k in sorted(pieces)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_format_beside_tools_on_auto_still_lets_the_model_call(openai_client: openai.OpenAI, stream: bool) -> None:
    free = chat(openai_client, ANOTHER_CITY, stream)
    assert free[1] and free[2] == "tool_calls", f"the model should call without a format: {free}"
    for response_format in (WEATHER_FORMAT, {"type": "json_object"}):
        content, calls, finish = chat(openai_client, ANOTHER_CITY, stream, response_format=response_format)
        assert (content, finish) == ("", "tool_calls")
        assert [name for name, _ in calls] == ["get_weather"] * len(calls) and calls
        assert json.loads(calls[0][1]) == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_after_the_result_the_answer_follows_the_format(openai_client: openai.OpenAI, stream: bool) -> None:
    messages = with_result([{"role": "user", "content": "What is the weather in Paris?"}], "Paris", "Sunny, 22 C")
    content, calls, finish = chat(openai_client, messages, stream, response_format=WEATHER_FORMAT)
    assert (calls, finish) == ([], "stop")
    Weather.model_validate_json(content)
    jsonschema.validate(json.loads(content), Weather.model_json_schema())


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_call_beside_a_format_is_this_turns_output(openai_client: openai.OpenAI, tool_choice, stream: bool) -> None:
    content, calls, finish = chat(openai_client, [{"role": "user", "content": "What is the weather in Paris?"}],
                                  stream, tool_choice=tool_choice, response_format=WEATHER_FORMAT)
    assert (content, finish) == ("", "tool_calls")
    assert calls and all(name == "get_weather" for name, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])
