"""Clients that send slowly cannot hold the shim (a real shim process in front of the fake engine):
a request whose headers or body do not arrive within --read-timeout gets 408 and its connection
closes, an idle keep-alive connection closes, while an SSE stream that runs longer than that
timeout is not cut; --max-connections bounds the connections served at once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process
from test_shim_drain import read_to_end, sse_data
from test_shim_http import open_raw_stream, request, say

READ_TIMEOUT_S = 1.0
# Far beyond the read timeout, for a loaded machine: a shim without one keeps these connections open.
CLOSE_WAIT_S = 15.0
PARTIAL_BODY = b'{"model": "' + MODEL_ID.encode() + b'", "mess'


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer) -> Iterator[str]:
    process, url = start_shim(fake.address, "--read-timeout", str(READ_TIMEOUT_S), "--heartbeat-interval", "0.3")
    yield url
    stop_process(process)


def connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=CLOSE_WAIT_S)
    return sock


def slow_request(url: str, head_only: bool) -> socket.socket:
    """A request sent in pieces, never completed: headers without their blank line, or a partial body."""
    sock = connect(url)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if head_only:
        pieces = [head.encode(), b"X-Slow: 1", b"\r\n", b"X-Slower: 2"]
    else:
        pieces = [(head + "Content-Length: 100000\r\n\r\n").encode(), *[PARTIAL_BODY[k:k + 4] for k in range(0, 20, 4)]]
    for piece in pieces:  # a little at a time, each piece well within the timeout
        sock.sendall(piece)
        time.sleep(READ_TIMEOUT_S / 5)
    return sock


def answer_then_close(sock: socket.socket) -> bytes:
    """Everything the shim sends until it closes the connection (a timeout here: it never did)."""
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except ConnectionResetError:  # closed with unread bytes: a reset, also a close
        pass
    return data


def slow_request_answer(url: str, head_only: bool) -> bytes:
    """What the shim answered a slow_request before it closed the connection."""
    sock = slow_request(url, head_only)
    try:
        return answer_then_close(sock)
    finally:
        sock.close()


@pytest.mark.parametrize("head_only", [True, False], ids=["headers", "body"])
def test_a_request_sent_too_slowly_gets_408_and_its_connection_closes(shim, head_only) -> None:
    stream = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("long:75"), "stream": True})  # >= 1.5 s
    with ThreadPoolExecutor(3) as pool:  # three slow senders at once, each timed out on its own
        answers = list(pool.map(lambda _: slow_request_answer(shim, head_only), range(3)))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code": "request_timeout"' in answer
    # The stream, longer than the read timeout, ran to its end.
    events = sse_data(read_to_end(stream))
    assert events[-1] == "[DONE]" and len(events) > 75
    stream.close()


def test_an_idle_keep_alive_connection_closes(shim) -> None:
    sock = connect(shim)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = answer_then_close(sock)  # the answer, then nothing more is sent: closed by the read timeout
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1") == 1
    sock.close()


def test_connections_beyond_the_bound_wait_until_one_closes(fake: FakeEngineServer) -> None:
    process, url = start_shim(fake.address, "--read-timeout", str(READ_TIMEOUT_S), "--max-connections", "2")
    idle = [connect(url) for _ in range(2)]  # connected, sending nothing: they hold both places
    try:
        status, _, _ = request(url, "GET", "/v1/models")  # answered once the read timeout freed a place
        assert status == 200
        for sock in idle:  # so both had been closed by then
            sock.setblocking(False)
            assert sock.recv(1) == b""
    finally:
        for sock in idle:
            sock.close()
        stop_process(process)
