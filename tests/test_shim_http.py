"""The shim as a real process on loopback, in front of a scripted gRPC engine (tests/fake_engine.py).

Clients are the official openai SDK (sync and async) and raw sockets / http.client where the exact
bytes, headers or a disconnect matter.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from urllib.parse import urlparse

import pytest

from common import lazy_module
from fake_engine import MODEL_CREATED, MODEL_ID, start_shim, stop_process

openai = lazy_module("openai")  # imported by the first test that uses it

HEARTBEAT_S = 0.3


@pytest.fixture(scope="module")
def shim(fake):
    process, url = start_shim(fake.address, "--heartbeat-interval", str(HEARTBEAT_S))
    yield url
    stop_process(process)


@pytest.fixture
def client(shim):
    with openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30) as sdk:
        yield sdk


@pytest.fixture
def aclient(shim):
    return openai.AsyncOpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30)


def say(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def post(url: str, path: str, body, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """A raw request; returns status, lower-cased headers and the whole body."""
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    result = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return result


def request(url: str, method: str, path: str) -> tuple[int, dict, bytes]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request(method, path)
    response = conn.getresponse()
    result = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return result


def sse_events(raw: bytes) -> list[str]:
    """Splits an SSE body into events, checking the framing on the way."""
    assert raw.endswith(b"\n\n")
    return [block for block in raw.decode().split("\n\n")[:-1]]


def open_raw_stream(url: str, body: dict) -> socket.socket:
    """Sends a request on a bare socket, so the test controls exactly when the client leaves."""
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parsed.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    sock.sendall(head + data)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        piece = sock.recv(65536)
        assert piece, f"connection closed before {marker!r}; got {data!r}"
        data += piece
    return data


# ------------------------------------------------------------------ models and health


def test_models_list_and_retrieve(client):
    models = client.models.list().data
    assert [(m.id, m.object, m.owned_by, m.created) for m in models] == [(MODEL_ID, "model", "conduit", MODEL_CREATED)]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"


def test_health_follows_the_engine_health_service(shim, fake):
    status, _, body = request(shim, "GET", "/health")
    assert status == 200 and json.loads(body)["engine"] == "SERVING"
    fake.set_serving(False)
    try:
        status, _, body = request(shim, "GET", "/health")
        assert status == 503 and json.loads(body)["engine"] == "NOT_SERVING"
    finally:
        fake.set_serving(True)


# ------------------------------------------------------------------ chat


def test_chat_completion_sync(client):
    response = client.chat.completions.create(model=MODEL_ID, messages=say("hello"))
    assert response.id.startswith("chatcmpl-") and response.object == "chat.completion"
    assert response.model == MODEL_ID and response.created > 0
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "Hello from choice 0."
    assert choice.finish_reason == "stop" and choice.logprobs is None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (1, 5, 6)


def test_chat_max_tokens_gives_length_and_n_gives_choices(client):
    response = client.chat.completions.create(model=MODEL_ID, messages=say("hello"), n=3, max_tokens=2)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert {c.message.content for c in response.choices} == {"Hello from"}
    assert {c.finish_reason for c in response.choices} == {"length"}
    assert response.usage.completion_tokens == 6


def test_chat_fields_reach_the_engine(client):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "echo-request"}]},
        ],
        temperature=0.25,
        top_p=0.5,
        seed=42,
        stop=["x", "y"],
        max_completion_tokens=50,
        presence_penalty=0.5,
        logit_bias={"12": -100},
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        user="someone",
        extra_body={"top_k": 5, "min_tokens": 2, "repetition_penalty": 1.1},
    )
    response = raw.parse()
    seen = json.loads(response.choices[0].message.content)
    # The engine's request id is the HTTP request's (X-Request-Id), not the response's id.
    assert seen["request_id"] == raw.headers["x-request-id"] != response.id and seen["model"] == MODEL_ID
    assert [m["role"] for m in seen["chat"]["messages"]] == ["system", "user"]
    assert seen["sampling"]["temperature"] == 0.25 and seen["sampling"]["top_p"] == 0.5
    assert seen["sampling"]["seed"] == "42" and seen["sampling"]["top_k"] == 5
    assert seen["sampling"]["logit_bias"] == {"12": -100.0}
    assert seen["stopping"] == {"max_tokens": 50, "min_tokens": 2, "stop": ["x", "y"]}
    assert json.loads(seen["constraint"]["json_schema"]) == schema


def test_chat_stream_sync_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=say("hello"), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from choice 0."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_async_multiplexes_n_choices(aclient):
    async def run():
        stream = await aclient.chat.completions.create(model=MODEL_ID, messages=say("hello"), n=2, stream=True)
        texts, finishes = {0: "", 1: ""}, {}
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
        return texts, finishes

    texts, finishes = asyncio.run(run())
    assert texts == {0: "Hello from choice 0.", 1: "Hello from choice 1."}
    assert finishes == {0: "stop", 1: "stop"}


def test_chat_async_non_stream(aclient):
    response = asyncio.run(aclient.chat.completions.create(model=MODEL_ID, messages=say("unicode")))
    assert response.choices[0].message.content == "héllo 世界 🚀"


def test_chat_logprobs(client):
    response = client.chat.completions.create(
        model=MODEL_ID, messages=say("hello"), logprobs=True, top_logprobs=2, max_tokens=2
    )
    content = response.choices[0].logprobs.content
    assert [(t.token, t.logprob, t.bytes) for t in content] == [
        ("Hello", -0.5, list(b"Hello")),
        (" from", -1.0, list(b" from")),
    ]
    assert [len(t.top_logprobs) for t in content] == [2, 2]


def test_chat_tool_calls(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    response = client.chat.completions.create(model=MODEL_ID, messages=say("tools"), tools=tools)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name, json.loads(call.function.arguments)) == (
        "call_fake1",
        "function",
        "get_weather",
        {"city": "Paris"},
    )


def test_chat_tool_calls_streamed(client):
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=say("tools"), tools=tools, stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == [0, 0]
    assert (deltas[0].id, deltas[0].type, deltas[0].function.name) == ("call_fake1", "function", "get_weather")
    assert deltas[1].id is None and deltas[1].function.name is None
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ------------------------------------------------------------------ completions


def test_completions_prompt_list_numbers_choices_by_prompt(client):
    response = client.completions.create(model=MODEL_ID, prompt=["one", "two"], n=2, echo=True, max_tokens=1)
    assert response.id.startswith("cmpl-") and response.object == "text_completion"
    assert [(c.index, c.text) for c in response.choices] == [
        (0, "oneHello"),
        (1, "oneHello"),
        (2, "twoHello"),
        (3, "twoHello"),
    ]
    assert response.usage.prompt_tokens == 2 and response.usage.completion_tokens == 4


def test_completions_echo_logprobs(client):
    response = client.completions.create(model=MODEL_ID, prompt="a b", echo=True, logprobs=1, max_tokens=1)
    logprobs = response.choices[0].logprobs
    assert logprobs.tokens == ["a", " b", "Hello"]
    assert logprobs.token_logprobs == [None, -1.0, -0.5]
    assert logprobs.text_offset == [0, 1, 3]


def test_completions_token_id_prompts(client, fake):
    raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt=[[5, 6], [7]], max_tokens=3)
    assert [c.text for c in raw.parse().choices] == ["Hello from choice"] * 2
    request_id = raw.headers["x-request-id"]
    sent = {r.request_id: list(r.token_ids.ids) for r in fake.engine.requests if r.request_id.startswith(request_id)}
    assert sent == {f"{request_id}-0": [5, 6], f"{request_id}-1": [7]}


def test_completions_best_of_picks_the_best_candidate(client):
    response = client.completions.create(model=MODEL_ID, prompt="hi", n=1, best_of=3, max_tokens=5)
    assert [c.text for c in response.choices] == ["Hello from choice 0."]  # choice 0 has the highest logprobs
    assert response.choices[0].logprobs is None


def test_completions_stream_async(aclient):
    async def run():
        stream = await aclient.completions.create(
            model=MODEL_ID, prompt=["a", "b"], stream=True, stream_options={"include_usage": True}
        )
        return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "Hello from choice 0.", 1: "Hello from choice 0."}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


# ------------------------------------------------------------------ SSE bytes and headers


def test_stream_headers_and_framing(shim):
    status, headers, raw = post(
        shim, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hello"), "stream": True}
    )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    events = sse_events(raw)
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    bodies = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all("usage" not in b for b in bodies)  # no usage key unless include_usage
    assert bodies[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_heartbeats_while_the_engine_is_silent(shim, client):
    status, _, raw = post(
        shim, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("slow:0.6"), "stream": True}
    )
    events = sse_events(raw)
    assert status == 200 and ": keep-alive" in events
    assert events.index(": keep-alive") < next(i for i, e in enumerate(events) if '"content":"Hello"' in e)
    # The SDK ignores the comments.
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=say("slow:0.5"), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from choice 0."


# ------------------------------------------------------------------ cancellation


def test_client_leaving_a_stream_cancels_the_engine_call(shim, fake):
    sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("hang"), "stream": True})
    head = read_until(sock, b'"role":"assistant"')
    request_id = next(
        line.split(": ")[1] for line in head.decode().split("\r\n") if line.lower().startswith("x-request-id")
    )
    sock.close()
    assert fake.engine.wait_cancelled(request_id)


def test_client_leaving_mid_generation_cancels(shim, fake):
    sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("long:100000"), "stream": True})
    head = read_until(sock, b'"content":" t3"')
    request_id = next(
        line.split(": ")[1] for line in head.decode().split("\r\n") if line.lower().startswith("x-request-id")
    )
    sock.close()
    assert fake.engine.wait_cancelled(request_id)


def test_client_leaving_a_non_streaming_request_cancels(shim, fake):
    before = len(fake.engine.requests)
    sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("hang")})
    deadline = time.monotonic() + 10
    while len(fake.engine.requests) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    request_id = fake.engine.requests[-1].request_id
    sock.close()
    assert fake.engine.wait_cancelled(request_id)


def test_sdk_closing_a_stream_early_cancels(client, fake):
    stream = client.chat.completions.create(model=MODEL_ID, messages=say("long:100000"), stream=True)
    next(iter(stream))
    stream.close()
    assert fake.engine.wait_cancelled(stream.response.headers["x-request-id"])


# ------------------------------------------------------------------ errors


def error_of(raw: bytes) -> dict:
    body = json.loads(raw)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_invalid_json_body(shim):
    status, headers, raw = post(shim, "/v1/chat/completions", b"{not json")
    assert status == 400 and headers["content-type"] == "application/json"
    assert error_of(raw)["code"] == "invalid_json"
    status, _, raw = post(shim, "/v1/completions", b"[1, 2]")
    assert status == 400 and error_of(raw)["type"] == "invalid_request_error"
    status, _, raw = post(shim, "/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and error_of(raw)["code"] == "invalid_json"
    status, _, raw = post(shim, "/v1/completions", b'{"model": "fake-model", "prompt": "\\ud800"}')
    assert status == 400 and error_of(raw)["code"] == "invalid_json"


def test_unknown_route_and_wrong_method(shim):
    status, _, raw = request(shim, "GET", "/v1/nope")
    assert status == 404 and error_of(raw)["code"] == "unknown_url"
    status, headers, raw = request(shim, "GET", "/v1/chat/completions")
    assert status == 405 and error_of(raw)["code"] == "method_not_allowed" and "POST" in headers["allow"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=say("hello"))
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_bad_input_is_400_naming_the_param(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_ID, messages=say("hello"), temperature=3)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_ID, prompt="x", suffix="tail")
    assert info.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
        )
    assert info.value.body["param"] == "messages[0].content[0].type"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),  # the field the user sent
        ({"top_p": 0.5}, "top_p"),
    ],
)
def test_fields_the_engine_refuses_are_named_as_sent(shim, fields, param):
    path = {"response_format": "constraint", "structured_outputs": "constraint", "top_p": "sampling.top_p"}[param]
    status, _, raw = post(shim, "/v1/chat/completions",
                          {"model": MODEL_ID, "messages": say(f"bad-field:{path}"), **fields})
    assert status == 400 and error_of(raw)["param"] == param


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "code, status",
    [
        ("INVALID_ARGUMENT", 400),
        ("NOT_FOUND", 404),
        ("RESOURCE_EXHAUSTED", 429),
        ("UNAVAILABLE", 503),
        ("DEADLINE_EXCEEDED", 504),
        ("INTERNAL", 500),
    ],
)
def test_engine_errors_map_to_http_statuses(shim, code, status, stream):
    got, headers, raw = post(
        shim,
        "/v1/chat/completions",
        {"model": MODEL_ID, "messages": say(f"error:{code}:engine says no"), "stream": stream},
    )
    assert got == status  # early errors get a real status even on a stream
    message = error_of(raw)["message"]
    if status == 500:  # an engine failure names the request, the key to both processes' logs
        assert "engine says no" in message and headers["x-request-id"] in message
    else:
        assert message.endswith("engine says no")
    if status in (429, 503):
        assert headers["retry-after"] == "1"


def test_error_mid_stream_is_a_last_error_event_without_done(shim, client):
    status, headers, raw = post(
        shim, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("midstream-error"), "stream": True}
    )
    events = sse_events(raw)
    assert status == 200 and "data: [DONE]" not in events  # [DONE] would say the answer is complete
    error = json.loads(events[-1][len("data: ") :])["error"]
    assert "broke mid-stream" in error["message"] and error["type"] == "server_error"
    assert headers["x-request-id"] in error["message"]
    with pytest.raises(openai.APIError, match="broke mid-stream"):
        list(client.chat.completions.create(model=MODEL_ID, messages=say("midstream-error"), stream=True))


# ------------------------------------------------------------------ concurrency


def test_twenty_concurrent_streams(aclient):
    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(model=MODEL_ID, messages=say("slow:0.3"), stream=True, seed=i)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def run():
        return await asyncio.gather(*(one(i) for i in range(20)))

    assert asyncio.run(run()) == ["Hello from choice 0."] * 20


# ------------------------------------------------------------------ other shim configurations


def test_engine_down_gives_503(tmp_path):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    process, url = start_shim(dead)
    try:
        status, _, body = request(url, "GET", "/health")
        assert status == 503 and json.loads(body)["engine"] == "UNREACHABLE"
        status, headers, raw = request(url, "GET", "/v1/models")
        assert status == 503 and error_of(raw)["code"] == "engine_unavailable" and "retry-after" in headers
        status, _, raw = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")})
        assert status == 503
    finally:
        stop_process(process)


def test_api_key_is_required_when_configured(fake):
    process, url = start_shim(fake.address, "--api-key", "sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        with openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", max_retries=0) as good:
            assert good.chat.completions.create(model=MODEL_ID, messages=say("hi")).choices[0].message.content
        assert request(url, "GET", "/health")[0] == 200  # health stays open for probes
    finally:
        stop_process(process)


def test_request_timeout_becomes_a_deadline(fake):
    process, url = start_shim(fake.address, "--request-timeout", "0.3", "--heartbeat-interval", str(HEARTBEAT_S))
    try:
        status, _, raw = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hang")})
        assert status == 504 and error_of(raw)["code"] == "timeout"
        status, _, raw = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hang"), "stream": True})
        events = sse_events(raw)
        assert status == 200 and "data: [DONE]" not in events
        assert json.loads(events[-1][len("data: ") :])["error"]["code"] == "timeout"
    finally:
        stop_process(process)


def test_lora_adapter_routes_answer_as_vllm_with_the_engines_refusal(shim):
    """/v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): the fields checked first, then the engine asked:
    this one (the fake) predates LoadAdapter, which the 400 names. The real engines' answers: test_lora_runtime.py."""
    status, _, body = post(shim, "/v1/load_lora_adapter", {"lora_name": "sql"})
    error = json.loads(body)["error"]
    assert status == 400 and error["type"] == "InvalidUserInput" and error["param"] == "lora_path"
    assert "Both 'lora_name' and 'lora_path' must be provided." in error["message"]
    status, _, body = post(shim, "/v1/unload_lora_adapter", {"lora_name": 7})
    assert status == 400 and json.loads(body)["error"]["param"] == "lora_name"
    status, _, body = post(shim, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/adapters/sql"})
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "lora_runtime_updating_off" and "LoadAdapter" in error["message"]
