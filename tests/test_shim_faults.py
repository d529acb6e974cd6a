"""The shim when its engine dies and comes back: the fake engine (tests/fake_engine.py) runs as a
process of its own, SIGKILLed mid-stream and restarted on the same port."""

from __future__ import annotations

import json
import signal
import time

from fake_engine import MODEL_ID, start_fake_engine_process, start_shim, stop_process
from test_shim_http import error_of, open_raw_stream, post, read_until, request, say
from test_shim_drain import read_to_end, sse_data

# A stream ends within about a second of its engine's death; the margin is for a loaded machine.
# A shim that kept waiting on a dead engine would hit it and fail the test.
STREAM_END_TIMEOUT_S = 3.0
RECOVERY_TIMEOUT_S = 15.0


def test_engine_killed_mid_stream_then_back():
    engine, address = start_fake_engine_process()
    port = int(address.rsplit(":", 1)[1])
    shim, url = start_shim(address, "--heartbeat-interval", "0.3")
    try:
        assert request(url, "GET", "/health")[0] == 200
        sock = open_raw_stream(url, {"model": MODEL_ID, "messages": say("long:100000"), "stream": True})
        read_until(sock, b'"content":" t2"')

        engine.send_signal(signal.SIGKILL)
        engine.wait()
        sock.settimeout(STREAM_END_TIMEOUT_S)
        events = sse_data(read_to_end(sock))  # a timeout here: the stream outlived its engine
        sock.close()
        assert "[DONE]" not in events
        error = json.loads(events[-1])["error"]
        assert error["code"] == "engine_unavailable" and error["type"] == "server_error"

        # New requests fail at once with 503 and Retry-After; /health says why.
        for stream in (False, True):
            status, headers, raw = post(url, "/v1/chat/completions",
                                        {"model": MODEL_ID, "messages": say("hi"), "stream": stream})
            assert status == 503 and headers["retry-after"] and error_of(raw)["code"] == "engine_unavailable"
        status, _, body = request(url, "GET", "/health")
        assert status == 503 and json.loads(body)["engine"] == "UNREACHABLE"

        # The engine comes back on the same address: the shim serves again by itself.
        engine, _ = start_fake_engine_process(port)
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while request(url, "GET", "/health")[0] != 200:
            assert time.monotonic() < deadline, "the shim did not reconnect to the restarted engine"
            time.sleep(0.1)
        status, _, raw = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")})
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "Hello from choice 0."
    finally:
        stop_process(shim)
        stop_process(engine)
