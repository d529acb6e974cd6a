"""Anthropic's Messages API in the shim, against the fake engine (tests/fake_engine.py), with the
real anthropic SDK as the client: the request reaching the engine, the message object, the event
stream's framing, Anthropic's errors (the SDK's typed exceptions), x-api-key, request-id,
heartbeats as pings, a client leaving, and the drain's 529."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from common import lazy_module
from fake_engine import MODEL_ID, start_shim, stop_process
from http_shim.errors import APIError
from http_shim.messages.request import parse_messages
from test_shim_drain import EXIT_TIMEOUT_S, wait_for_engine_request
from test_shim_http import post, request

anthropic = lazy_module("anthropic")
KEY = "messages-key"
BODY_LIMIT = 100_000
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
WEATHER_TOOL = {"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def shim(fake):
    process, url = start_shim(fake.address, "--api-key", KEY, "--heartbeat-interval", "0.3",
                              "--max-body-bytes", str(BODY_LIMIT))
    yield url
    stop_process(process)


@pytest.fixture(scope="module")
def client(shim):
    with anthropic.Anthropic(base_url=shim, api_key=KEY, max_retries=0, timeout=30) as sdk:
        yield sdk


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def events_of(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event; the name must equal the data's type."""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], block
        out.append((lines["event"], data))
    return out


def stream_events(shim: str, body: dict) -> list[tuple[str, dict]]:
    status, headers, raw = post(shim, "/v1/messages", {"model": MODEL_ID, "max_tokens": 20, "stream": True, **body},
                                HEADERS)
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw
    return events_of(raw)


def error_of(raw: bytes) -> dict:
    body = json.loads(raw)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


# ------------------------------------------------------------------ the message object


def test_message_object_usage_and_request_id(client):
    raw = client.messages.with_raw_response.create(model=MODEL_ID, max_tokens=20, messages=user("hi"),
                                                   extra_headers={"X-Request-Id": "msg-test-1"})
    message = raw.parse()
    assert raw.headers["request-id"] == "msg-test-1" and message._request_id == "msg-test-1"
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL_ID
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello from choice 0.")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (1, 5)
    assert (message.usage.cache_read_input_tokens, message.usage.cache_creation_input_tokens) == (0, 0)


def test_max_tokens_cuts_with_stop_reason_max_tokens(client):
    message = client.messages.create(model=MODEL_ID, max_tokens=2, messages=user("hi"))
    assert message.content[0].text == "Hello from" and message.stop_reason == "max_tokens"


def test_the_request_reaching_the_engine(client):
    """Turns, tools, tool_choice, format and sampling become the chat request the engine renders."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True},
            {"type": "text", "text": "echo-request"}]},
    ]
    message = client.messages.create(
        model=MODEL_ID, max_tokens=50, messages=messages,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[WEATHER_TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"], metadata={"user_id": "u-1"},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40, "some_future_field": {"x": 1}},
    )
    sent = json.loads(message.content[0].text)
    chat = sent["chat"]
    assert [(m["role"], m.get("content", "")) for m in chat["messages"]] == [
        ("system", "Be brief."), ("user", "Weather?"), ("assistant", "Let me look."),
        ("tool", "Sunny"), ("tool", "Error: timeout"), ("user", "echo-request")]
    assert chat["messages"][2]["tool_calls"] == [{"id": "toolu_1", "name": "get_weather",
                                                  "arguments": '{"city": "Paris"}'}]
    assert [m.get("tool_call_id") for m in chat["messages"][3:5]] == ["toolu_1", "toolu_2"]
    assert chat["tools"][0]["name"] == "get_weather"
    assert json.loads(chat["tools"][0]["parameters_json"]) == WEATHER_TOOL["input_schema"]
    assert chat["tool_choice"] == {"mode": "MODE_REQUIRED"} and chat["parallel_tool_calls"] is False
    assert json.loads(sent["constraint"]["json_schema"]) == {"type": "object"}
    assert sent["sampling"] == {"temperature": 0.5, "top_p": pytest.approx(0.9), "top_k": 40}
    assert sent["stopping"] == {"max_tokens": 50, "stop": ["END"]}


def test_claude_code_fields_are_accepted_as_hints(shim):
    """What Claude Code sends on every request: thinking adaptive (or enabled: the model answers without
    thinking), context_management, output_config.effort, the ?beta=true query, a deferred tool (left out
    of the prompt, as Anthropic leaves it out of the model's context)."""
    deferred = {"name": "Placeholder", "input_schema": {"type": "object"}, "defer_loading": True}
    for thinking in ({"type": "adaptive", "display": "omitted"}, {"type": "enabled", "budget_tokens": 1024}):
        body = {"model": MODEL_ID, "max_tokens": 32000, "messages": user("echo-request"), "thinking": thinking,
                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                "output_config": {"effort": "high"}, "tools": [WEATHER_TOOL, deferred]}
        status, _, raw = post(shim, "/v1/messages?beta=true", body,
                              {**HEADERS, "anthropic-beta": "context-management-2025-06-27,effort-2025-11-24"})
        assert status == 200, raw
        sent = json.loads(json.loads(raw)["content"][0]["text"])
        assert [t["name"] for t in sent["chat"]["tools"]] == ["get_weather"]
        assert sent["stopping"]["max_tokens"] == 32000  # the engine caps it to what the context leaves


def test_system_messages_in_the_turns_fold_into_the_user_turn_they_touch(client):
    """Claude Code sends its environment as a system message after the user's; the chat templates of most
    models refuse a second system turn, so it joins the user text before it (or the next one)."""
    messages = [{"role": "system", "content": "First."},
                {"role": "user", "content": "Weather?"},
                {"role": "system", "content": [{"type": "text", "text": "Env."}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]},
                {"role": "system", "content": "Reminder."}, {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "echo-request"}]
    sent = json.loads(client.messages.create(model=MODEL_ID, max_tokens=5, system="Top.", messages=messages,
                                             tools=[WEATHER_TOOL]).content[0].text)
    assert [(m["role"], m.get("content", "")) for m in sent["chat"]["messages"]] == [
        ("system", "Top."), ("user", "First.\n\nWeather?\n\nEnv."), ("assistant", ""), ("tool", "Sunny"),
        ("user", "Reminder."), ("assistant", "Sunny."), ("user", "echo-request")]


def test_a_prompt_over_the_context_is_worded_as_anthropic_words_it(client):
    """Claude Code compacts the conversation when the error reads "prompt is too long: N tokens > M maximum"."""
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL_ID, max_tokens=5, messages=user("too-long:70"))
    assert refused.value.body["error"]["message"] == "prompt is too long: 70 tokens > 64 maximum"


def test_tool_choice_by_name_and_none(client, fake):
    for choice, expected in [({"type": "tool", "name": "get_weather"}, {"mode": "MODE_FUNCTION",
                                                                        "function_name": "get_weather"}),
                             ({"type": "none"}, {"mode": "MODE_NONE"})]:
        message = client.messages.create(model=MODEL_ID, max_tokens=50, messages=user("echo-request"),
                                         tools=[WEATHER_TOOL], tool_choice=choice)
        assert json.loads(message.content[0].text)["chat"]["tool_choice"] == expected


def test_tool_use_whole(client):
    message = client.messages.create(model=MODEL_ID, max_tokens=20, messages=user("tools"), tools=[WEATHER_TOOL])
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name == "get_weather"
    assert block.input == {"city": "Paris"}


# ------------------------------------------------------------------ the event stream


def test_text_stream_events_in_order(shim):
    events = stream_events(shim, {"messages": user("hi")})
    names = [name for name, _ in events]
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * 5 + [
        "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 1 and start["usage"]["output_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == "Hello from choice 0."
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 5


def test_tool_use_stream_input_json_deltas(shim, client):
    events = stream_events(shim, {"messages": user("tools"), "tools": [WEATHER_TOOL]})
    assert [name for name, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                            "content_block_delta", "content_block_stop", "message_delta",
                                            "message_stop"]
    block = events[1][1]["content_block"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_") and block["input"] == {}
    pieces = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(p["type"] == "input_json_delta" for p in pieces)
    assert json.loads("".join(p["partial_json"] for p in pieces)) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # The SDK's accumulated message says the same.
    with client.messages.stream(model=MODEL_ID, max_tokens=20, messages=user("tools"), tools=[WEATHER_TOOL]) as s:
        final = s.get_final_message()
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_pings_while_the_engine_is_silent(shim):
    names = [name for name, _ in stream_events(shim, {"messages": user("slow:0.6")})]
    assert "ping" in names and names[0] == "message_start" and names[-1] == "message_stop"


def test_engine_failure_mid_stream_is_an_error_event(shim, client):
    events = stream_events(shim, {"messages": user("midstream-error")})
    assert events[-1][0] == "error" and "message_stop" not in [name for name, _ in events]
    assert events[-1][1]["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError, match="mid-stream"):
        with client.messages.stream(model=MODEL_ID, max_tokens=20, messages=user("midstream-error")) as stream:
            stream.get_final_message()


def test_client_leaving_a_stream_cancels_the_engine_call(client, fake):
    request_id = f"msg-leave-{uuid.uuid4().hex}"
    stream = client.messages.create(model=MODEL_ID, max_tokens=100000, messages=user("long:100000"), stream=True,
                                    extra_headers={"X-Request-Id": request_id})
    events = iter(stream)
    for _ in range(4):
        next(events)
    stream.close()
    assert fake.engine.wait_cancelled(request_id)


# ------------------------------------------------------------------ errors and the edge


@pytest.mark.parametrize("body, named", [
    ({"messages": user("hi")}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, '"image"'),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     '"document"'),
    ({"max_tokens": 5, "messages": user("hi"), "thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]},
                                    {"role": "user", "content": "go"}]}, "thinking"),
    ({"max_tokens": 5, "messages": user("hi"), "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "server tool"),
    ({"max_tokens": 5, "messages": user("hi") + [{"role": "assistant", "content": "The"}]}, "prefill"),
    ({"max_tokens": 5, "messages": user("hi"), "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool",
                                                                                       "name": "nope"}}, "nope"),
    ({"max_tokens": 5, "messages": user("hi"), "tool_choice": {"type": "any"}}, "tools"),
    ({"max_tokens": 5, "messages": user("hi"), "temperature": 1.5}, "temperature"),
    ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role: Input should be"),
    ({"max_tokens": 5, "messages": user("hi"), "output_config": {"format": {"type": "xml"}}}, "output_config"),
])
def test_bad_bodies_are_400_naming_the_field(shim, body, named):
    status, headers, raw = post(shim, "/v1/messages", {"model": MODEL_ID, **body}, HEADERS)
    assert status == 400 and headers["request-id"]
    error = error_of(raw)
    assert error["type"] == "invalid_request_error" and named in error["message"], error


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": None}, "'max_tokens' is required."),
    ({"messages": [{"role": "tool", "content": "x"}]},
     "messages.0.role: Input should be 'user', 'assistant' or 'system', got \"tool\"."),
    ({"thinking": {"type": "sometimes"}},
     "'thinking.type' must be 'adaptive', 'enabled' or 'disabled', got \"sometimes\"."),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     'Content blocks of type "image" are not supported by this server: it serves text, tool_use and tool_result '
     "blocks."),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]},
     "'messages[0].content[0]': tool_use blocks belong in assistant messages."),
    ({"system": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
     "'system[0]' is a thinking block: thinking blocks belong in assistant messages."),
    ({"messages": [*user("a"), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}, *user("b")]},
     "'messages[1].content[0].signature': a thinking block given back needs the signature it came with."),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]},
     "'tools[0]' is a server tool (\"bash_20250124\"), which this server does not run: define client tools with "
     "name, description and input_schema."),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
     "'tool_choice' names the tool 'nope', which is not in 'tools'."),
    ({"mcp_servers": [{"url": "x"}]}, "'mcp_servers' is not supported: this server connects to no MCP server."),
    ({"messages": [*user("hi"), {"role": "assistant", "content": "The"}]},
     "The last message is an assistant turn (a prefill), which this server cannot continue: end with a user message."),
])
def test_refusals_keep_their_words(body, message):
    """The Messages API's own refusals, word for word (clients and agents match on some of them)."""
    with pytest.raises(APIError) as refused:
        parse_messages({"model": MODEL_ID, "max_tokens": 5, "messages": user("hi"), **body}, "msg-1")
    assert refused.value.message == message


def test_the_sdk_raises_its_typed_errors(shim, client):
    def create(sdk: anthropic.Anthropic, **params) -> None:
        sdk.messages.create(**{"model": MODEL_ID, "max_tokens": 5, "messages": user("hi"), **params})

    with pytest.raises(anthropic.AuthenticationError) as caught:
        create(anthropic.Anthropic(base_url=shim, api_key="wrong", max_retries=0))
    assert caught.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError):
        create(client, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    with pytest.raises(anthropic.NotFoundError) as caught:
        create(client, model="no-such-model")
    assert caught.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.RateLimitError) as caught:
        create(client, messages=user("error:RESOURCE_EXHAUSTED:queue full"))
    assert caught.value.response.headers["retry-after"] and caught.value.body["error"]["type"] == "rate_limit_error"
    # Bearer auth, as the SDK's auth_token sends it, works too.
    bearer = anthropic.Anthropic(base_url=shim, auth_token=KEY, max_retries=0)
    assert bearer.messages.create(model=MODEL_ID, max_tokens=5, messages=user("hi")).content


def test_unknown_url_body_too_large_and_unauthenticated_are_anthropic_shaped(shim):
    status, _, raw = post(shim, "/v1/messages/batches", {}, HEADERS)
    assert status == 404 and error_of(raw)["type"] == "not_found_error"
    status, _, raw = post(shim, "/v1/messages", b"x" * (BODY_LIMIT + 1), HEADERS)
    assert status == 413 and error_of(raw)["type"] == "request_too_large"
    status, _, raw = post(shim, "/v1/messages", {"model": MODEL_ID, "max_tokens": 5, "messages": user("hi")})
    assert status == 401 and error_of(raw)["type"] == "authentication_error"
    # The OpenAI routes keep OpenAI's shape.
    status, _, raw = post(shim, "/v1/chat/completions", {"model": MODEL_ID, "messages": user("hi")})
    assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"


def test_models_list_in_anthropic_shape(client, shim):
    page = client.models.list()
    assert [m.id for m in page.data] == [MODEL_ID] and page.data[0].type == "model" and not page.has_more
    assert client.models.retrieve(MODEL_ID).display_name == MODEL_ID
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no-such-model")
    # Without anthropic-version: OpenAI's list.
    openai_request = urllib.request.Request(f"{shim}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(openai_request, timeout=30) as response:
        assert json.load(response)["object"] == "list"


def test_count_tokens_reaches_the_engine_tokenizer(client):
    count = client.messages.count_tokens(model=MODEL_ID, system="one two", messages=user("three four five"))
    assert count.input_tokens == 5  # the fake counts words
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=user("x"))


def test_draining_answers_529_and_cuts_running_streams_with_an_error_event(fake):
    process, url = start_shim(fake.address, "--heartbeat-interval", "0.3", "--drain-seconds", "1")
    try:
        sdk = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=EXIT_TIMEOUT_S)
        with ThreadPoolExecutor(1) as pool:
            seen = len(fake.engine.requests)
            def answer_hang() -> anthropic.types.Message:
                with sdk.messages.stream(model=MODEL_ID, max_tokens=5, messages=user("hang")) as stream:
                    return stream.get_final_message()

            running = pool.submit(answer_hang)
            wait_for_engine_request(fake, "hang", seen)
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + EXIT_TIMEOUT_S
            while request(url, "GET", "/health")[0] != 503:
                assert time.monotonic() < deadline, "the shim did not start draining"
                time.sleep(0.01)
            with pytest.raises(anthropic.APIStatusError) as caught:
                sdk.messages.create(model=MODEL_ID, max_tokens=5, messages=user("hi"))
            assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
            with pytest.raises(anthropic.APIStatusError, match="shut down before this answer was complete"):
                running.result(timeout=EXIT_TIMEOUT_S)
        assert process.wait(EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(process)
