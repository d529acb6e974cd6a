"""An engine that stops answering without closing its connections: two fake engine processes
(tests/fake_engine.py, on the engine's own gRPC server) behind one shim, one frozen with SIGSTOP
mid-stream. Its kernel still acknowledges TCP, so only the shim's keepalive pings, unanswered,
reveal it: every stream on it must end with an error event within the keepalive bound, a request
sent to it before that (no answer yet) is served by the other replica, the streams on the other
replica keep flowing, and new requests are served there.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from fake_engine import MODEL_ID, start_fake_engine_process, start_shim, stop_process
from test_shim_drain import sse_data
from test_shim_http import open_raw_stream, post, read_until, say

STREAMS = 8
KEEPALIVE = ("--engine-keepalive", "1", "--engine-keepalive-timeout", "1")
# The flags' bound is 1 + 1 = 2 s; the rest is margin for a loaded machine. A shim without
# keepalive leaves the frozen engine's streams open past it, and the test fails.
FROZEN_STREAM_END_S = 20.0


class StreamReader:
    """Reads one raw SSE response on a thread: what came, when the last token came, whether it ended."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""
        self.last_token_at = 0.0
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:  # to the chunked response's last chunk, or the connection's end
            while not self.data.endswith(b"\r\n0\r\n\r\n") and (piece := self.sock.recv(65536)):
                self.data += piece
                if b'"content"' in piece:
                    self.last_token_at = time.monotonic()
        except OSError:
            pass
        self.ended.set()


@pytest.fixture
def engines() -> Iterator[list]:
    started = [start_fake_engine_process(), start_fake_engine_process()]
    yield started
    for process, _ in started:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def test_a_frozen_replica_fails_its_streams_and_the_other_serves_on(engines) -> None:
    (frozen, frozen_address), (_, live_address) = engines
    shim, url = start_shim(f"{frozen_address},{live_address}", "--routing", "round_robin",
                           "--heartbeat-interval", "0.5", *KEEPALIVE)
    sockets = []
    try:
        for _ in range(STREAMS):  # dealt in turn: half on each replica
            sock = open_raw_stream(url, {"model": MODEL_ID, "messages": say("long:100000"), "stream": True})
            read_until(sock, b'"content":" t2"')
            sock.settimeout(None)
            sockets.append(sock)
        readers = [StreamReader(sock) for sock in sockets]

        frozen.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        # Sent before the shim knows: the one dealt to the frozen replica answered nothing there, so
        # once its connection is declared dead it is sent to the other replica.
        early: list[int] = []
        senders = [threading.Thread(target=lambda k=k: early.append(post(
            url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say(f"early {k}")})[0])) for k in range(2)]
        for sender in senders:
            sender.start()
        deadline = frozen_at + FROZEN_STREAM_END_S
        # Each stream either ends (the frozen replica's) or gets tokens well after the freeze (the live one's).
        while not all(r.ended.is_set() or r.last_token_at > frozen_at + 1.0 for r in readers):
            assert time.monotonic() < deadline, "a stream on the frozen engine is still open"
            time.sleep(0.05)

        cut = [r for r in readers if r.ended.is_set()]
        assert len(cut) == STREAMS // 2, "the frozen replica's streams, and only those, end"
        for reader in cut:
            events = sse_data(reader.data)
            assert "[DONE]" not in events  # an error event, never a clean end
            error = json.loads(events[-1])["error"]
            assert error["type"] == "server_error" and error["code"] == "engine_unavailable", error

        for sender in senders:
            sender.join(FROZEN_STREAM_END_S)
        assert early == [200, 200]
        for k in range(6):  # new requests go to the live replica, at once
            status, _, raw = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say(f"after {k}")})
            assert status == 200, raw
    finally:
        for sock in sockets:
            sock.close()
        stop_process(shim)
