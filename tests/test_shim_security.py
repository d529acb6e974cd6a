"""The shim's security and limits, as a real process in front of the fake engine (tests/fake_engine.py):
several API keys from flags, a key file and the environment; what stays open; the request body
limit (413, also for chunked bodies and Content-Length headers that lie); the operator's caps on
max_tokens, n, stop, messages and prompt characters, each a 400 naming the parameter."""

from __future__ import annotations

import io
import json
import socket
from contextlib import redirect_stderr
from urllib.parse import urlparse

import pytest

from common import lazy_module
from fake_engine import MODEL_ID, start_shim, stop_process
from http_shim import auth, options
from test_shim_http import error_of, post, request, say

openai = lazy_module("openai")  # imported by the first test that uses it

BODY_LIMIT = 4000
FLAG_KEYS = ["key-flag-1", "key-flag-2"]
FILE_KEY = "key-from-file"
ENV_KEYS = ["key-env-1", "key-env-2"]
CAPS = {"max_tokens": 100, "n": 2, "stop": 2, "messages": 3, "prompt_chars": 60}


@pytest.fixture(scope="module")
def shim(fake, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# the team's keys\n\n  {FILE_KEY}  \n# commented-out-key\n")
    process, url = start_shim(
        fake.address,
        *[arg for key in FLAG_KEYS for arg in ("--api-key", key)],
        "--api-key-file", str(key_file),
        "--max-body-bytes", str(BODY_LIMIT),
        "--max-tokens-limit", str(CAPS["max_tokens"]),
        "--max-n", str(CAPS["n"]),
        "--max-stop", str(CAPS["stop"]),
        "--max-messages", str(CAPS["messages"]),
        "--max-prompt-chars", str(CAPS["prompt_chars"]),
        env={"CONDUIT_API_KEYS": ",".join(ENV_KEYS)},
    )
    yield url
    stop_process(process)


@pytest.fixture
def client(shim):
    return openai.OpenAI(base_url=f"{shim}/v1", api_key=FLAG_KEYS[0], max_retries=0, timeout=30)


AUTH = {"Authorization": f"Bearer {FLAG_KEYS[0]}"}


# ------------------------------------------------------------------ API keys


@pytest.mark.parametrize("key", [*FLAG_KEYS, FILE_KEY, *ENV_KEYS])
def test_every_configured_key_is_accepted(shim, key):
    client = openai.OpenAI(base_url=f"{shim}/v1", api_key=key, max_retries=0, timeout=30)
    assert client.chat.completions.create(model=MODEL_ID, messages=say("hi")).choices[0].message.content


@pytest.mark.parametrize("key", ["wrong", "commented-out-key", f"{FLAG_KEYS[0]}x", FLAG_KEYS[0][:-1]])
def test_other_keys_get_401_in_openai_shape(shim, key):
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=f"{shim}/v1", api_key=key, max_retries=0).models.list()
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    status, headers, raw = post(shim, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")},
                                {"Authorization": f"Bearer {key}"})
    assert status == 401 and error_of(raw)["type"] == "invalid_request_error"
    assert headers["www-authenticate"] == "Bearer" and headers["x-request-id"]


def test_missing_or_malformed_authorization_is_401(shim):
    status, _, raw = request(shim, "GET", "/v1/models")
    assert status == 401 and "didn't provide an API key" in error_of(raw)["message"]
    for header in (f"Basic {FLAG_KEYS[0]}", FLAG_KEYS[0], "Bearer", f"Bearer {FLAG_KEYS[0]} {FLAG_KEYS[1]}"):
        status, _, raw = post(shim, "/v1/completions", {"model": MODEL_ID, "prompt": "hi"}, {"Authorization": header})
        assert status == 401 and error_of(raw)["code"] == "invalid_api_key", header


def test_health_metrics_and_schema_stay_open(shim):
    assert request(shim, "GET", "/health")[0] == 200
    status, headers, body = request(shim, "GET", "/metrics")
    assert status == 200 and b"conduit:http_requests_total" in body
    status, _, body = request(shim, "GET", "/openapi.json")
    assert status == 200 and json.loads(body)["security"] == [{"bearer": []}]


def test_key_sources_are_merged_and_a_key_file_without_keys_is_refused(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("a\n\n# b\n  c  \n")
    assert auth.collect_keys(["x", "a"], [key_file], {"CONDUIT_API_KEYS": " y ,, z", "CONDUIT_API_KEY": "w"}) == (
        "x", "a", "c", "y", "z", "w")
    empty = tmp_path / "empty"
    empty.write_text("# nothing here\n\n")
    # The shim refuses to start rather than run open because a key file was empty.
    code, message = usage_error(["--api-key-file", str(empty), "--port", "0"])
    assert code == 2 and "holds no API key" in message


# ------------------------------------------------------------------ request body limit


def raw_exchange(url: str, head: bytes, body: bytes = b"", timeout_s: float = 10.0) -> tuple[bytes, bool]:
    """Sends head+body on a bare socket; returns what came back, and whether the server closed the
    connection (True) rather than leaving it open (False, seen as a read timeout)."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s) as sock:
        sock.sendall(head + body)
        data = b""
        try:
            while piece := sock.recv(65536):
                data += piece
            return data, True
        except TimeoutError:
            return data, False


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def head_for(url: str, extra: str) -> bytes:
    host = urlparse(url).netloc
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {FLAG_KEYS[0]}\r\n{extra}\r\n").encode()


def big_body(size: int) -> bytes:
    padding = "x" * size
    return json.dumps({"model": MODEL_ID, "messages": say("hi"), "user": padding}).encode()[:size]


def test_a_body_over_the_limit_is_413_in_openai_shape(shim):
    status, headers, raw = post(shim, "/v1/chat/completions", big_body(BODY_LIMIT + 1), AUTH)
    assert status == 413 and error_of(raw)["code"] == "request_too_large"
    assert str(BODY_LIMIT) in error_of(raw)["message"] and headers["x-request-id"]
    # Just under the limit is served (the prompt itself is small).
    body = json.dumps({"model": MODEL_ID, "messages": say("hi"), "user": "x" * (BODY_LIMIT - 200)}).encode()
    assert len(body) <= BODY_LIMIT and post(shim, "/v1/chat/completions", body, AUTH)[0] == 200


def test_a_huge_content_length_is_refused_without_reading_the_body(shim):
    # Nothing of the announced 10 GB is sent: the answer comes at once and the connection is closed
    # (reading and discarding the body would leave this waiting).
    data, closed = raw_exchange(shim, head_for(shim, f"Content-Length: {10 * 2**30}\r\n"))
    status, headers, body = parse_response(data)
    assert status == 413 and error_of(body)["code"] == "request_too_large" and closed


def test_a_chunked_body_over_the_limit_is_413_and_the_rest_is_not_read(shim):
    chunk = b"x" * 1500
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4))  # 6000 bytes, no last chunk
    data, closed = raw_exchange(shim, head_for(shim, "Transfer-Encoding: chunked\r\n"), chunks)
    status, headers, body = parse_response(data)
    assert status == 413 and error_of(body)["code"] == "request_too_large"
    assert headers["connection"] == "close" and closed


def test_a_chunked_body_under_the_limit_is_served(shim):
    body = json.dumps({"model": MODEL_ID, "messages": say("hi")}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    data, _ = raw_exchange(shim, head_for(shim, "Transfer-Encoding: chunked\r\nConnection: close\r\n"), chunked)
    status, _, raw = parse_response(data)
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "Hello from choice 0."


def test_a_content_length_shorter_than_the_body_reads_only_what_it_announced(shim):
    body = big_body(BODY_LIMIT * 3)
    data, _ = raw_exchange(shim, head_for(shim, "Content-Length: 20\r\nConnection: close\r\n"), body, 5.0)
    status, _, raw = parse_response(data)
    assert status == 400 and error_of(raw.split(b"\r\n\r\n")[0])["code"] == "invalid_json"


# ------------------------------------------------------------------ caps


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": CAPS["max_tokens"] + 1}, "max_tokens"),
        ({"max_completion_tokens": CAPS["max_tokens"] + 1}, "max_completion_tokens"),
        ({"n": CAPS["n"] + 1}, "n"),
        ({"stop": ["a", "b", "c"]}, "stop"),
        ({"messages": say("hi") * (CAPS["messages"] + 1)}, "messages"),
        ({"messages": say("x" * (CAPS["prompt_chars"] + 1))}, "messages"),
        ({"messages": [{"role": "system", "content": "y" * 40}, *say("x" * 21)]}, "messages"),
    ],
)
def test_chat_caps_are_400_naming_the_param(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{"model": MODEL_ID, "messages": say("hi"), **fields})
    assert info.value.body["param"] == param and "on this server" in info.value.body["message"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_tokens": CAPS["max_tokens"] + 1}, f"'max_tokens' may be at most {CAPS['max_tokens']} on this server"),
        ({"stop_sequences": ["a", "b", "c"]}, f"'stop_sequences' may hold at most {CAPS['stop']} strings"),
        ({"messages": say("hi") * (CAPS["messages"] + 1)}, f"'messages' may hold at most {CAPS['messages']} messages"),
        ({"system": "y" * 40, "messages": say("x" * 21)}, "characters of prompt text on this server"),
    ],
)
def test_messages_caps_are_anthropic_400s(shim, fields, message):
    """The same caps on Anthropic's Messages API, in its error shape (no param: the message names the field)."""
    body = {"model": MODEL_ID, "max_tokens": 5, "messages": say("hi"), **fields}
    status, _, raw = post(shim, "/v1/messages", body, AUTH)
    error = json.loads(raw)["error"]
    assert status == 400 and error["type"] == "invalid_request_error" and message in error["message"], error


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": CAPS["max_tokens"] + 1}, "max_tokens"),
        ({"n": CAPS["n"] + 1}, "n"),
        ({"best_of": CAPS["n"] + 1}, "best_of"),
        ({"stop": ["a", "b", "c"]}, "stop"),
        ({"prompt": "x" * (CAPS["prompt_chars"] + 1)}, "prompt"),
        ({"prompt": ["x" * 30, "y" * 31]}, "prompt"),
    ],
)
def test_completion_caps_are_400_naming_the_param(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**{"model": MODEL_ID, "prompt": "hi", **fields})
    assert info.value.body["param"] == param and "on this server" in info.value.body["message"]


def test_requests_at_the_caps_are_served(client, fake):
    response = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "system", "content": "s" * 20}, *say("a" * 20), *say("echo-request")],
        max_tokens=CAPS["max_tokens"], n=CAPS["n"], stop=["x", "y"])
    seen = json.loads(response.choices[0].message.content)
    assert seen["stopping"]["max_tokens"] == CAPS["max_tokens"] and seen["n"] == CAPS["n"]
    completion = client.completions.create(model=MODEL_ID, prompt="z" * CAPS["prompt_chars"], best_of=CAPS["n"])
    assert completion.choices[0].text
    # Without max_tokens the cap is the limit.
    unbounded = client.chat.completions.create(model=MODEL_ID, messages=say("echo-request"))
    assert json.loads(unbounded.choices[0].message.content)["stopping"]["max_tokens"] == CAPS["max_tokens"]


def test_the_schema_states_the_caps(shim):
    schemas = json.loads(request(shim, "GET", "/openapi.json")[2])["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["maximum"] == CAPS["max_tokens"] and chat["n"]["maximum"] == CAPS["n"]
    assert chat["messages"]["maxItems"] == CAPS["messages"]
    assert chat["stop"]["oneOf"][1]["maxItems"] == CAPS["stop"]
    messages = schemas["MessagesRequest"]["properties"]
    assert messages["max_tokens"]["maximum"] == CAPS["max_tokens"]
    assert messages["stop_sequences"]["maxItems"] == CAPS["stop"]
    assert messages["messages"]["maxItems"] == CAPS["messages"]


def test_limits_beyond_the_engine_are_refused_at_start():
    code, message = usage_error(["--max-n", "17", "--port", "0"])
    assert code == 2 and "max_n" in message


def usage_error(argv: list[str]) -> tuple[int, str]:
    """(exit code, message) of the shim's own parsing of `argv`, in this process: a usage error."""
    with pytest.raises(SystemExit) as exited, redirect_stderr(io.StringIO()) as stderr:
        options.parse_args(argv)
    return exited.value.code, stderr.getvalue()
