"""Graceful drain of the shim, as a real process in front of the fake engine (tests/fake_engine.py):
on SIGTERM/SIGINT /health and new generations answer 503 at once while running answers finish
(streams with [DONE]), then the process exits 0; past --drain-seconds, or at a second signal,
what still runs ends with an OpenAI error (a stream's last event, never [DONE])."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import lazy_module
from fake_engine import MODEL_ID, start_shim, stop_process
from test_shim_http import error_of, open_raw_stream, post, read_until, request, say

openai = lazy_module("openai")  # imported by the first test that uses it

EXIT_TIMEOUT_S = 20


def started_shim(fake, *args: str) -> tuple[subprocess.Popen, str]:
    return start_shim(fake.address, "--heartbeat-interval", "0.3", *args)


def read_to_end(sock) -> bytes:
    """A chunked response read to its last chunk (or to the connection's end)."""
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n") and (piece := sock.recv(65536)):
        data += piece
    return data


def sse_data(raw: bytes) -> list[str]:
    """The data: payloads of a raw HTTP/1.1 chunked SSE response (chunk sizes dropped)."""
    return [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]


def wait_for_engine_request(fake, content: str, seen_before: int) -> None:
    """Until the fake engine received a request whose last message is `content` (after the first `seen_before`)."""
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while not any(r.chat.messages[-1].content == content for r in list(fake.engine.requests)[seen_before:]):
        assert time.monotonic() < deadline, f"the engine never received {content!r}"
        time.sleep(0.01)


def signal_and_wait_for_drain(process: subprocess.Popen, url: str, sig: int) -> None:
    """Signals the shim and waits until /health says it drains (the signal is handled asynchronously)."""
    process.send_signal(sig)
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while True:
        status, _, body = request(url, "GET", "/health")
        if status == 503:
            assert json.loads(body)["status"] == "draining"
            return
        assert time.monotonic() < deadline, "the shim did not start draining"
        time.sleep(0.01)


def metric(url: str, name: str) -> float:
    text = request(url, "GET", "/metrics")[2].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


def test_drain_refuses_new_work_finishes_running_work_then_exits_0(fake):
    process, url = started_shim(fake, "--drain-seconds", "30")
    try:
        # A stream of 40 tokens 20 ms apart, and a non-streamed answer that takes 0.6 s.
        sock = open_raw_stream(url, {"model": MODEL_ID, "messages": say("long:40"), "stream": True})
        read_until(sock, b'"content":" t1"')
        with ThreadPoolExecutor(1) as pool:
            seen = len(fake.engine.requests)
            pending = pool.submit(post, url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("slow:0.6")})
            wait_for_engine_request(fake, "slow:0.6", seen)
            signal_and_wait_for_drain(process, url, signal.SIGTERM)

            for path, body in [("/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")}),
                               ("/v1/completions", {"model": MODEL_ID, "prompt": "hi", "stream": True})]:
                status, headers, raw = post(url, path, body)
                assert status == 503 and headers["retry-after"] == "1", path
                assert error_of(raw)["code"] == "server_shutting_down" and error_of(raw)["type"] == "server_error"
            assert metric(url, "conduit:http_draining") == 1

            status, _, raw = pending.result(timeout=EXIT_TIMEOUT_S)
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "Hello from choice 0."
        events = sse_data(read_to_end(sock))
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])
        assert text.endswith(" t38 t39")
        assert process.wait(EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(process)


def test_past_the_deadline_running_work_ends_with_an_error_never_done(fake):
    process, url = started_shim(fake, "--drain-seconds", "0.5")
    try:
        sock = open_raw_stream(url, {"model": MODEL_ID, "messages": say("long:100000"), "stream": True})
        read_until(sock, b'"content":" t1"')
        with ThreadPoolExecutor(1) as pool:
            seen = len(fake.engine.requests)
            pending = pool.submit(post, url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hang")})
            wait_for_engine_request(fake, "hang", seen)
            process.send_signal(signal.SIGTERM)
            status, headers, raw = pending.result(timeout=EXIT_TIMEOUT_S)
        assert status == 503 and error_of(raw)["code"] == "server_shutting_down" and headers["retry-after"]
        events = sse_data(read_to_end(sock))
        assert "[DONE]" not in events
        assert json.loads(events[-1])["error"]["code"] == "server_shutting_down"
        assert process.wait(EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(process)


def test_a_second_signal_cuts_at_once(fake):
    process, url = started_shim(fake, "--drain-seconds", "600")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=EXIT_TIMEOUT_S)
        stream = client.chat.completions.create(model=MODEL_ID, messages=say("long:100000"), stream=True)
        chunks = iter(stream)
        next(chunks)
        signal_and_wait_for_drain(process, url, signal.SIGINT)
        process.send_signal(signal.SIGTERM)
        # The SDK raises on the error event; [DONE] would have ended the loop quietly.
        with pytest.raises(openai.APIError, match="shut down before this answer was complete"):
            for _ in chunks:
                pass
        assert process.wait(EXIT_TIMEOUT_S) == 0
    finally:
        stop_process(process)


def test_an_idle_shim_exits_at_once(fake):
    process, url = started_shim(fake)
    assert request(url, "GET", "/health")[0] == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(EXIT_TIMEOUT_S) == 0
