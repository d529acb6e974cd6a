"""How replies that mix prose, calls and formatted answers are read back (issues 38 and 52), on the
chat, Responses and Messages routes, whole and streamed, with the real SDKs against the real stack.

The default model is steered into each reply by the conversation itself: two earlier turns in
which the assistant wrote exactly that reply (as plain text) to the same question. Greedily it
writes it a third time, so the test knows the raw output and checks how the engine reads it:
prose before and after `<tool_call>` blocks is content and the calls are calls, in the order
written where the API has one (Responses' items, Messages' blocks), and no markup is ever sent as text;
a tag shown in a code fence is text; an answer in the response format stays the answer even
when its `name` is a tool's name; a call beside a format is still a call. The last test runs the
OpenAI Agents SDK's `output_type` agent whose answer has a tool's name in its `name` field.

The session stack drafts tokens (n-gram speculative decoding, on by default: core/speculation.py): each reply
repeats the conversation, the workload drafts are for, so these run ~1.6x faster than without, and they show
replies read alike when several of their tokens come in one step (one request alone computes the same
greedy tokens with drafts as without: tests/test_speculation_stack.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pydantic
import pytest

from launcher.stack import Stack
from common import MODEL, lazy_module

agents = lazy_module("agents")
anthropic = lazy_module("anthropic")

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def openai_client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client

QUESTION = "What is the weather in Paris?"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = {"get_weather": "Get the weather in a city", "get_time": "Get the local time in a city"}
MAX_TOKENS = 90


def tagged(name: str, city: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"city": "{city}"}}}}</tool_call>'


PROSE = "I'll check the weather for you."
AFTER = "I will tell you what I find."
PARIS = ("get_weather", '{"city": "Paris"}')


def schema(**properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


# An answer format with a `name` (the Agents SDK's output_type), and one shaped like a call.
PLACE = schema(name={"type": "string"}, country={"type": "string"})
CALL_SHAPED = schema(name={"type": "string"}, arguments=CITY)


@dataclass
class Case:
    output: str  # what the model writes (it wrote exactly this twice before)
    content: str  # the reply's text before its calls (all of it when it has none), as read
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)
    answer_format: dict | None = None
    after: str = ""  # the reply's text after its calls

    @property
    def finish(self) -> str:
        return "tool_calls" if self.calls else "stop"

    @property
    def text(self) -> str:
        """All of the reply's text, as chat's `content` (and Responses' output_text) has it."""
        return self.content + self.after


CASES = {
    "prose-then-a-call": Case(f"{PROSE}\n{tagged('get_weather', 'Paris')}", PROSE, [PARIS]),
    "prose-then-two-calls": Case(f"{PROSE}\n{tagged('get_weather', 'Paris')}\n{tagged('get_time', 'Paris')}", PROSE,
                                 [PARIS, ("get_time", '{"city": "Paris"}')]),
    "a-call-then-whitespace": Case(f"{tagged('get_weather', 'Paris')}\n\n", "", [PARIS]),
    "a-tag-in-a-code-fence": Case(f"Calls look like this:\n```\n{tagged('get_weather', 'Paris')}\n```",
                                  f"Calls look like this:\n```\n{tagged('get_weather', 'Paris')}\n```"),
    "an-answer-named-like-a-tool": Case('{"name": "get_weather", "country": "France"}',
                                        '{"name": "get_weather", "country": "France"}', answer_format=PLACE),
    "an-answer-shaped-like-a-call": Case('{"name": "get_weather", "arguments": {"city": "Paris"}}',
                                         '{"name": "get_weather", "arguments": {"city": "Paris"}}',
                                         answer_format=CALL_SHAPED),
    "a-call-beside-a-format": Case(tagged("get_weather", "Paris"), "", [PARIS], answer_format=PLACE),
    "prose-a-call-and-prose": Case(f"{PROSE}\n{tagged('get_weather', 'Paris')}\n{AFTER}", PROSE, [PARIS],
                                   after=f"\n{AFTER}"),
    "a-call-then-prose": Case(f"{tagged('get_weather', 'Paris')}\n{AFTER}", "", [PARIS], after=AFTER),
}
# On Messages (which has no response format), the cases whose reply has both text and tool_use blocks.
MESSAGES_CASES = [name for name, case in CASES.items() if case.text and case.calls]


def steering(output: str) -> list[dict]:
    """Two turns in which the assistant answered QUESTION with `output`, then QUESTION again."""
    turn = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": output}]
    return [*turn, *turn, {"role": "user", "content": QUESTION}]


def assert_no_markup(pieces: list[str]) -> None:
    """No streamed text piece is or starts tool-call markup (a code fence's example aside)."""
    for piece in pieces:
        assert "<tool_call>" not in piece and not piece.strip().startswith("<"), pieces


def needs_markup_check(case: Case) -> bool:
    return "```" not in case.output


# ---------------------------------------------------------------------------------------------- chat


def chat_reply(client: openai.OpenAI, case: Case, stream: bool) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason), read from the whole reply or from its deltas."""
    request = dict(model=MODEL, messages=steering(case.output), temperature=0, max_tokens=MAX_TOKENS,
                   tools=[{"type": "function", "function": {"name": n, "description": d, "parameters": CITY}}
                          for n, d in TOOLS.items()])
    if case.answer_format is not None:
        request["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "final_output", "strict": True, "schema": case.answer_format}}
    if not stream:
        choice = client.chat.completions.create(**request).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content or "", calls, choice.finish_reason
    texts, calls, finish = [], {}, ""
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta
        if delta.content:
            texts.append(delta.content)
        for piece in delta.tool_calls or []:
            name, arguments = calls.get(piece.index, ("", ""))
            calls[piece.index] = (name or piece.function.name or "", arguments + (piece.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    if needs_markup_check(case):
        assert_no_markup(texts)
    return "".join(texts), [calls[k] for k in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(CASES))
def test_chat_reads_the_reply(openai_client: openai.OpenAI, name: str, stream: bool) -> None:
    case = CASES[name]
    assert chat_reply(openai_client, case, stream) == (case.text, case.calls, case.finish)


# ----------------------------------------------------------------------------------------- responses


def responses_reply(client: openai.OpenAI, case: Case, stream: bool) -> tuple[str, list[tuple[str, str]], str]:
    """(text, [(name, arguments)], status) of a response: its output items, and streamed, the
    text deltas and function-call items must agree with the final response."""
    request = dict(model=MODEL, input=steering(case.output), temperature=0, max_output_tokens=MAX_TOKENS,
                   tools=[{"type": "function", "name": n, "description": d, "parameters": CITY, "strict": True}
                          for n, d in TOOLS.items()])
    if case.answer_format is not None:
        request["text"] = {"format": {"type": "json_schema", "name": "final_output", "strict": True,
                                      "schema": case.answer_format}}
    if not stream:
        response = client.responses.create(**request)
    else:
        events = list(client.responses.create(stream=True, **request))
        response = events[-1].response
        assert events[-1].type == "response.completed"
        texts = [e.delta for e in events if e.type == "response.output_text.delta"]
        if needs_markup_check(case):
            assert_no_markup(texts)
        assert "".join(texts) == response.output_text
        streamed_calls = [(e.item.name, e.item.arguments) for e in events
                          if e.type == "response.output_item.done" and e.item.type == "function_call"]
        items = [(e.type, e.output_index) for e in events if e.type.startswith("response.output_item.")]
        assert items == [(f"response.output_item.{kind}", k) for k in range(len(response.output))
                         for kind in ("added", "done")], "one item at a time"
        assert streamed_calls == [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
    calls = [(item.name, item.arguments) for item in response.output if item.type == "function_call"]
    items = [(item.type, item.content[0].text if item.type == "message" else item.name) for item in response.output]
    assert items == ([("message", case.content)] if case.content else []) + [
        ("function_call", name) for name, _ in calls] + ([("message", case.after)] if case.after else []), items
    return response.output_text, calls, response.status


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(CASES))
def test_responses_reads_the_reply(openai_client: openai.OpenAI, name: str, stream: bool) -> None:
    case = CASES[name]
    assert responses_reply(openai_client, case, stream) == (case.text, case.calls, "completed")


# ------------------------------------------------------------------------------------------ messages


@pytest.fixture(scope="module")
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.shim_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", MESSAGES_CASES)
def test_messages_reads_the_reply_into_text_and_tool_use_blocks(claude: anthropic.Anthropic, name: str,
                                                               stream: bool) -> None:
    case = CASES[name]
    request = dict(model=MODEL, messages=steering(case.output), max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
                   tools=[{"name": n, "description": d, "input_schema": CITY} for n, d in TOOLS.items()])
    if stream:
        with claude.messages.stream(**request) as events:
            texts = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
            message = events.get_final_message()
        if needs_markup_check(case):
            assert_no_markup(texts)
    else:
        message = claude.messages.create(**request)
    expected = ([{"type": "text", "text": case.content}] if case.content else []) + [
        {"type": "tool_use", "name": n, "input": json.loads(a)} for n, a in case.calls] + (
        [{"type": "text", "text": case.after}] if case.after else [])
    got = [{"type": b.type, "text": b.text} if b.type == "text" else {"type": b.type, "name": b.name, "input": b.input}
           for b in message.content]
    assert got == expected
    assert message.stop_reason == ("tool_use" if case.calls else "end_turn")


# ------------------------------------------------------------------------------------------ agents


class Place(pydantic.BaseModel):
    name: str
    country: str


def agents_turn(city: str, country: str, k: int) -> list[dict]:
    """An earlier turn as Agents SDK input items: the question, a get_weather call, its result, and
    the typed answer naming the tool used."""
    call = f"call_{k}"
    return [{"role": "user", "content": f"What is the weather in {city}?"},
            {"type": "function_call", "call_id": call, "name": "get_weather", "arguments": json.dumps({"city": city})},
            {"type": "function_call_output", "call_id": call, "output": f"Sunny, 22 C in {city}"},
            {"role": "assistant", "content": json.dumps({"name": "get_weather", "country": country})}]


def test_agents_sdk_output_type_named_like_its_tool_completes(stack: Stack) -> None:
    """The request that looped to its turn limit (issue 38): tool_choice auto, an output_type with a
    `name` field, and a tool whose name the model puts there. Steered by two earlier turns, the model
    calls the tool once and answers `{"name": "get_weather", "country": "France"}`: the typed output,
    not a get_weather call without arguments."""
    agents.set_tracing_disabled(True)  # no platform key: the Agents SDK must not try to export traces
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        calls.append(city)
        return f"Sunny, 22 C in {city}"

    model = agents.OpenAIChatCompletionsModel(
        model=MODEL, openai_client=openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused"))
    agent = agents.Agent(name="weather", instructions="Answer with the tool you used and the country.", model=model,
                         tools=[get_weather], output_type=Place,
                         model_settings=agents.ModelSettings(tool_choice="auto", temperature=0, max_tokens=MAX_TOKENS))
    history = [*agents_turn("Rome", "Italy", 1), *agents_turn("London", "England", 2),
               {"role": "user", "content": QUESTION}]
    result = asyncio.run(agents.Runner.run(agent, history, max_turns=4))
    assert calls == ["Paris"]
    assert result.final_output == Place(name="get_weather", country="France")
