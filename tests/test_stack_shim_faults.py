"""The shim's drain and its engine's death, on the real stack (default model).

- SIGTERM to the shim: /health and new requests answer 503 at once while a running stream
  finishes normally ([DONE], all its tokens), then the shim exits 0; the engine is untouched.
- SIGKILL to the engine: a stream in flight ends at once with an OpenAI error event (the SDK
  raises; never a [DONE] that looks like success), new requests get 503 with Retry-After, and
  the shim serves again by itself once an engine is back on the same port.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from launcher.stack import Stack, spawn
from common import ANSWER, MODEL, STORY, ask, text_of
from conftest import STARTUP_TIMEOUT_S

pytestmark = pytest.mark.model

STREAM_TOKENS = 48  # long enough to be mid-stream when the signal lands
WAIT_S = 120.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=STARTUP_TIMEOUT_S) as running:
        yield running


def client_for(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)


def http_status(url: str, body: bytes | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)
    except (urllib.error.URLError, OSError):  # not listening (yet)
        return 0, {}


def wait_until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


CHAT_BODY = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' % MODEL.encode()


def test_engine_killed_mid_stream_then_back(stack: Stack) -> None:
    client = client_for(stack)
    stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2000, stream=True,
                                            extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    stack.engine.send_signal(signal.SIGKILL)
    stack.engine.wait()
    killed = time.monotonic()
    with pytest.raises(openai.APIError, match="engine is unavailable"):
        for _ in chunks:
            pass
    ended_after = time.monotonic() - killed
    assert ended_after < 5, f"the stream outlived its engine by {ended_after:.1f}s"

    status, headers = http_status(f"{stack.base_url}/chat/completions", CHAT_BODY)
    assert status == 503 and "Retry-After" in headers
    assert http_status(f"{stack.shim_url}/health")[0] == 503

    stack.engine = spawn(stack.engine_command(), stack.engine_log.with_name("engine-restarted.log"),
                         stack.engine_environment())
    wait_until(lambda: http_status(f"{stack.shim_url}/health")[0] == 200, "the shim did not find the new engine")
    assert text_of(ask(client)) == ANSWER


def test_shim_drains_a_running_stream_then_exits_zero(stack: Stack) -> None:
    client = client_for(stack)
    texts: list[str] = []
    finish: list[str | None] = []
    started = threading.Event()

    def consume() -> None:
        stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=STREAM_TOKENS,
                                                stream=True, temperature=0, extra_body={"ignore_eos": True})
        for chunk in stream:  # a cut stream would raise here; a [DONE] ends the loop
            for choice in chunk.choices:
                texts.append(choice.delta.content or "")
                started.set()
                if choice.finish_reason:
                    finish.append(choice.finish_reason)

    reader = threading.Thread(target=consume)
    reader.start()
    assert started.wait(WAIT_S)
    stack.shim.send_signal(signal.SIGTERM)
    wait_until(lambda: http_status(f"{stack.shim_url}/health")[0] == 503, "/health did not turn 503", 10)
    status, headers = http_status(f"{stack.base_url}/chat/completions", CHAT_BODY)
    assert status == 503 and headers.get("Retry-After")
    assert reader.is_alive(), "the stream ended before the drain could be observed"
    reader.join(WAIT_S)
    assert finish == ["length"]  # all its tokens, and a normal end
    assert stack.shim.wait(30) == 0
    assert stack.engine.poll() is None  # the engine is untouched

    # Leave the stack serving for whoever comes next.
    stack.shim = spawn(stack.shim_command(), stack.shim_log.with_name("shim-restarted.log"), stack.shim_environment())
    wait_until(lambda: http_status(f"{stack.shim_url}/health")[0] == 200, "the restarted shim did not come up")
    assert text_of(ask(client_for(stack))) == ANSWER
