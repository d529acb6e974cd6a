"""A reasoning model through the real engine and shim: the openai SDK reads its thinking apart from
its answer. The model (tests/reasoning_tokenizers.py) has DeepSeek-R1-Distill's real tokenizer and
chat template and writes a fixed script greedily: `<think>` thinking `</think>` then a JSON answer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from launcher.stack import Stack
from conftest import STARTUP_TIMEOUT_S
from reasoning_tokenizers import r1_distill_tokenizer, scripted_model

pytestmark = pytest.mark.model

THOUGHT = "Six sevens make forty two; I am sure."
ANSWER = '{"answer": 42}'
THINKING_TOKENS = 14  # <think>, "\n", 11 of the thought, </think>
QUESTION = [{"role": "user", "content": "What is six times seven?"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = scripted_model(tmp_path_factory.mktemp("r1-scripted"))
    with Stack(model=str(folder), startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.base_url, api_key="none", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.shim_url, api_key="none", max_retries=0) as sdk:
        yield sdk


def ask(client: openai.OpenAI, **params):
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=QUESTION, temperature=0, **params)


def test_thinking_then_answer(client):
    reply = ask(client)
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    assert message.model_extra["reasoning"] == THOUGHT
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens_details.reasoning_tokens == THINKING_TOKENS
    assert reply.usage.completion_tokens == len(r1_distill_tokenizer().encode(
        "<think>\n" + THOUGHT + "</think>" + ANSWER, add_special_tokens=False)) + 1  # and EOS


def test_an_earlier_turn_given_back_with_its_reasoning_is_taken(client):
    first = ask(client).choices[0].message
    model = client.models.list().data[0].id
    again = client.chat.completions.create(model=model, temperature=0, messages=[
        *QUESTION, first.model_dump(exclude_none=True), {"role": "user", "content": "And seven times six?"}])
    assert again.choices[0].message.reasoning_content == THOUGHT


def test_streamed_thinking_comes_as_reasoning_content(client):
    thinking = answer = ""
    usage = None
    for chunk in ask(client, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            thinking += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            answer += choice.delta.content or ""
            assert "<think>" not in answer and "</think>" not in thinking
    assert (thinking, answer) == (THOUGHT, ANSWER)
    assert usage.completion_tokens_details.reasoning_tokens == THINKING_TOKENS


def test_thinking_cut_by_max_tokens_has_no_answer(client):
    reply = ask(client, max_tokens=4)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "length"
    assert message.content is None
    assert message.reasoning_content == "Six se"


@pytest.mark.parametrize("budget", [3, 5, 9])
def test_a_thinking_budget_ends_the_thinking_at_exactly_n_tokens(client, budget):
    reply = ask(client, extra_body={"max_reasoning_tokens": budget})
    message = reply.choices[0].message
    assert reply.usage.completion_tokens_details.reasoning_tokens == budget
    # <think> and "\n" are not thought; the engine wrote </think> as the budget's last token.
    thought = r1_distill_tokenizer().decode(
        r1_distill_tokenizer().encode(THOUGHT, add_special_tokens=False)[:budget - 3])
    assert (getattr(message, "reasoning_content", None), message.content) == (thought or None, ANSWER)


def test_a_schema_constrains_the_answer_and_not_the_thinking(client):
    reply = ask(client, response_format={"type": "json_schema",
                                         "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
    message = reply.choices[0].message
    assert message.reasoning_content == THOUGHT
    assert json.loads(message.content) == {"answer": 42}


def test_a_forced_tool_call_follows_free_thinking(client):
    tool = {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}
    reply = ask(client, tools=[tool], tool_choice={"type": "function", "function": {"name": "answer"}},
                max_tokens=80)
    message = reply.choices[0].message
    assert message.reasoning_content == THOUGHT, message
    assert reply.choices[0].finish_reason == "tool_calls", message
    (call,) = message.tool_calls
    assert call.function.name == "answer"
    assert isinstance(json.loads(call.function.arguments)["answer"], int)


def test_a_bad_reasoning_effort_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, reasoning_effort="extreme")
    assert caught.value.body["param"] == "reasoning_effort"


# ------------------------------------------------------------------ Messages


def model_id(claude: anthropic.Anthropic) -> str:
    return claude.models.list().data[0].id


def test_messages_thinking_block_then_text(claude):
    message = claude.messages.create(model=model_id(claude), max_tokens=100, messages=QUESTION,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, text.type, text.text) == ("thinking", THOUGHT, "text", ANSWER)
    assert thinking.signature == "conduit-sha256:" + hashlib.sha256(THOUGHT.encode()).hexdigest()
    assert message.stop_reason == "end_turn"


def test_messages_budget_tokens_ends_the_thinking(claude):
    message = claude.messages.create(model=model_id(claude), max_tokens=100, messages=QUESTION,
                                     thinking={"type": "enabled", "budget_tokens": 5})
    thinking, text = message.content
    assert (thinking.thinking, text.text) == ("Six se", ANSWER)  # 5 tokens: <think>, "\n", 2, </think>


def test_messages_stream_thinking_deltas_and_a_signature(claude):
    with claude.messages.stream(model=model_id(claude), max_tokens=100, messages=QUESTION,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        deltas = [e.delta for e in stream if e.type == "content_block_delta"]
        message = stream.get_final_message()
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    (signature,) = [d.signature for d in deltas if d.type == "signature_delta"]
    assert message.content[0].signature == signature
    assert [b.type for b in message.content] == ["thinking", "text"] and message.content[1].text == ANSWER


def test_messages_take_thinking_blocks_back(claude):
    first = claude.messages.create(model=model_id(claude), max_tokens=100, messages=QUESTION,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    again = claude.messages.create(
        model=model_id(claude), max_tokens=100, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[*QUESTION, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": "And seven times six?"}])
    assert [b.type for b in again.content] == ["thinking", "text"]


# ------------------------------------------------------------------ Responses


def test_responses_reasoning_item_then_message(client):
    model = client.models.list().data[0].id
    response = client.responses.create(model=model, input="What is six times seven?", reasoning={"effort": "high"})
    reasoning, message = response.output
    assert (reasoning.type, reasoning.content[0].text, reasoning.summary) == ("reasoning", THOUGHT, [])
    assert (message.type, response.output_text) == ("message", ANSWER)
    assert response.reasoning.effort == "high"
    assert response.usage.output_tokens_details.reasoning_tokens == THINKING_TOKENS


def test_responses_stream_reasoning_events(client):
    model = client.models.list().data[0].id
    with client.responses.stream(model=model, input="What is six times seven?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == done.text == THOUGHT
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == ANSWER


def test_responses_take_reasoning_items_back_in_input(client):
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input="What is six times seven?", store=False)
    again = client.responses.create(model=model, input=[
        {"role": "user", "content": "What is six times seven?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "And seven times six?"}])
    assert [item.type for item in again.output] == ["reasoning", "message"]


def test_responses_cut_inside_the_thinking_is_incomplete_with_no_answer(client):
    model = client.models.list().data[0].id
    response = client.responses.create(model=model, input="What is six times seven?", max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.output[0].content[0].text == "Six se" and response.output_text == ""


def test_langchain_reads_the_reasoning_through_the_responses_api(stack, client):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=stack.base_url, api_key="none", model=client.models.list().data[0].id,
                     use_responses_api=True, reasoning={"summary": "auto"}, max_retries=0)
    blocks = llm.invoke("What is six times seven?").content_blocks
    assert [(b["type"], b.get("reasoning") or b.get("text")) for b in blocks] == [("reasoning", THOUGHT),
                                                                                  ("text", ANSWER)]


# ------------------------------------------------------------------ an agent


# A second scripted model: after the generation prompt it thinks then calls `lookup`; after the tool's
# output (the prompt then ends with the template's tool-outputs marker) it answers.
AGENT_SCRIPTS = {"<｜Assistant｜>": '<think>\nThe lookup tool knows.</think><tool_call>{"name":"lookup","arguments":{}}'
                                    "</tool_call>",
                 "<｜tool▁outputs▁end｜>": "It is 42!"}


def test_the_agents_sdk_runs_a_tool_calling_agent_on_a_reasoning_model(tmp_path):
    import asyncio

    import agents

    agents.set_tracing_disabled(True)  # no platform key: the Agents SDK must not try to export traces
    calls: list[str] = []

    @agents.function_tool
    def lookup() -> str:
        """Looks the answer up."""
        calls.append("lookup")
        return "42"

    folder = scripted_model(tmp_path / "agent", AGENT_SCRIPTS)
    with Stack(model=str(folder), engine_args=["--served-model-name", "reasoner"],
               startup_timeout=STARTUP_TIMEOUT_S) as running:
        sdk = openai.AsyncOpenAI(base_url=running.base_url, api_key="none", max_retries=0)
        model = agents.OpenAIResponsesModel(model="reasoner", openai_client=sdk)
        agent = agents.Agent(name="answerer", model=model, tools=[lookup],
                             model_settings=agents.ModelSettings(reasoning={"effort": "high"}))
        result = asyncio.run(agents.Runner.run(agent, "What is six times seven?", max_turns=3))
    assert calls == ["lookup"]
    assert result.final_output == "It is 42!"
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["reasoning_item", "tool_call_item"], kinds
