"""The shim's relay of engine streams under concurrency (http_shim/engine_stream.py), against the
scripted fake engine: many silent streams (more than gevent's thread pool, where grpc waits for
messages) must not hold up other requests, many streams must arrive whole, and many streams left
at once must all reach the engine as cancellations.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket

import pytest

from common import lazy_module
from fake_engine import MODEL_ID, start_shim, stop_process
from test_shim_http import open_raw_stream, read_until, say

openai = lazy_module("openai")  # imported by the first test that uses it

# More than gevent's default thread pool (10 threads).
MANY = 24


@pytest.fixture(scope="module")
def shim(fake):
    # A silent stream whose client left is noticed at its next heartbeat: 0.3 s here, not 5.
    process, url = start_shim(fake.address, "--heartbeat-interval", "0.3")
    yield url
    stop_process(process)


def _request_id(head: bytes) -> str:
    return next(line.split(": ")[1] for line in head.decode().split("\r\n")
                if line.lower().startswith("x-request-id"))


def test_silent_streams_do_not_hold_up_other_requests(shim, fake):
    silent = [open_raw_stream(shim, {"model": MODEL_ID, "messages": say("hang"), "stream": True})
              for _ in range(MANY)]
    try:
        ids = [_request_id(read_until(sock, b'"role":"assistant"')) for sock in silent]
        client = openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30)
        answer = client.chat.completions.create(model=MODEL_ID, messages=say("hi"))
        assert answer.choices[0].message.content == "Hello from choice 0."
    finally:
        for sock in silent:
            sock.close()
    assert all(fake.engine.wait_cancelled(request_id) for request_id in ids)


def test_many_streams_arrive_whole_and_cancel_together(shim, fake):
    def whole() -> str:
        sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("long:30"), "stream": True})
        with sock:
            body = read_until(sock, b"data: [DONE]\n\n").split(b"\r\n\r\n", 1)[1]
        # Chunked transfer encoding: the events are inside the chunks; the texts in order.
        events = [line[len("data: "):] for line in body.decode().split("\n")
                  if line.startswith("data: {")]
        return "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events)

    def left_early() -> str:
        sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("long:100000"), "stream": True})
        head = read_until(sock, b'"content":" t3"')
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        return _request_id(head)

    with concurrent.futures.ThreadPoolExecutor(2 * MANY) as pool:
        texts = [pool.submit(whole) for _ in range(MANY)]
        cancelled = [pool.submit(left_early) for _ in range(MANY)]
        expected = "".join(f" t{k}" for k in range(30))
        assert [t.result(timeout=60) for t in texts] == [expected] * MANY
        assert all(fake.engine.wait_cancelled(c.result(timeout=60)) for c in cancelled)


def test_grpc_still_waits_in_the_slices_the_shim_lengthens():
    """http_shim/__main__.py sets grpc._common.MAXIMUM_WAIT_TIMEOUT (its blocking waits' slice, which
    under gevent is only a timer a stream fires ~10 times a second). A grpc that stopped reading that
    global would bring the timers back silently; this test says so instead."""
    import grpc._common

    assert isinstance(grpc._common.MAXIMUM_WAIT_TIMEOUT, float)
    assert "MAXIMUM_WAIT_TIMEOUT" in grpc._common.wait.__code__.co_names
