"""Request ids, structured logs and Prometheus metrics of the shim, as a real process in front of
the fake engine (tests/fake_engine.py), which records the metadata of every call it gets."""

from __future__ import annotations

import json
import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import lazy_module
from fake_engine import MODEL_ID, start_shim, stop_process
from test_shim_http import error_of, open_raw_stream, post, read_until, request, say

openai = lazy_module("openai")  # imported by the first test that uses it

GENERATED_ID = re.compile(r"req_[0-9a-f]{32}")
CHAT = "/v1/chat/completions"
WAIT_S = 10.0


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    return tmp_path_factory.mktemp("shim") / "shim.log"


@pytest.fixture(scope="module")
def shim(fake, log_path):
    with open(log_path, "w") as log:
        process, url = start_shim(fake.address, "--heartbeat-interval", "0.3", "--log-format", "json", stderr=log)
    yield url
    stop_process(process)


def engine_call(fake, request_id: str):
    """The Generate request the fake engine got for `request_id`, and the call's metadata."""
    matches = [r for r in list(fake.engine.requests) if r.request_id == request_id]
    assert len(matches) == 1, f"expected one engine call for {request_id!r}, got {len(matches)}"
    return matches[0], fake.engine.metadata[request_id]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


# ------------------------------------------------------------------ request ids


def test_the_client_request_id_is_returned_and_sent_to_the_engine(shim, fake):
    request_id = "trace-Abc_123.4:5/6~"
    status, headers, raw = post(shim, CHAT, {"model": MODEL_ID, "messages": say("hi")}, {"X-Request-Id": request_id})
    assert status == 200 and headers["x-request-id"] == request_id
    sent, metadata = engine_call(fake, request_id)
    assert metadata["x-request-id"] == request_id and json.loads(raw)["id"].startswith("chatcmpl-")

    client = openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model=MODEL_ID, messages=say("hi"), stream=True,
                                            extra_headers={"X-Request-Id": "stream-id-1"})
    assert stream.response.headers["x-request-id"] == "stream-id-1"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "Hello from choice 0."
    assert engine_call(fake, "stream-id-1")[1]["x-request-id"] == "stream-id-1"


def test_every_answer_carries_the_request_id(shim):
    answers = [
        post(shim, CHAT, b"{not json", {"X-Request-Id": "err-400"}),
        post(shim, CHAT, {"model": "nope", "messages": say("hi")}, {"X-Request-Id": "err-404"}),
        post(shim, "/v1/nowhere", {}, {"X-Request-Id": "err-404-url"}),
        post(shim, CHAT, {"model": MODEL_ID, "messages": say("error:RESOURCE_EXHAUSTED:full")},
             {"X-Request-Id": "err-429"}),
    ]
    for (status, headers, raw), expected in zip(answers, ["err-400", "err-404", "err-404-url", "err-429"]):
        assert headers["x-request-id"] == expected and status >= 400 and error_of(raw)


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "tab\there", ""])
def test_unacceptable_request_ids_are_replaced(shim, fake, bad):
    status, headers, _ = post(shim, CHAT, {"model": MODEL_ID, "messages": say("hi")}, {"X-Request-Id": bad})
    replacement = headers["x-request-id"]
    assert status == 200 and GENERATED_ID.fullmatch(replacement)
    assert engine_call(fake, replacement)[1]["x-request-id"] == replacement


def test_a_request_without_an_id_gets_one(shim, fake):
    status, headers, _ = post(shim, "/v1/completions", {"model": MODEL_ID, "prompt": ["a", "b"]})
    request_id = headers["x-request-id"]
    assert status == 200 and GENERATED_ID.fullmatch(request_id)
    # One engine call per prompt, each named after the request and carrying its id as metadata.
    for i in range(2):
        assert engine_call(fake, f"{request_id}-{i}")[1]["x-request-id"] == request_id


def test_an_engine_failure_is_500_naming_the_request_id(shim):
    for stream in (False, True):
        status, headers, raw = post(
            shim, CHAT, {"model": MODEL_ID, "messages": say("error:INTERNAL:step failed"), "stream": stream},
            {"X-Request-Id": f"trace-me-{stream}"})
        error = error_of(raw)
        assert status == 500 and error["type"] == "server_error" and "step failed" in error["message"]
        assert f"trace-me-{stream}" in error["message"]


# ------------------------------------------------------------------ logs


def log_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_json_logs_name_the_request_in_every_line_about_it(shim, log_path):
    post(shim, CHAT, {"model": MODEL_ID, "messages": say("midstream-error"), "stream": True},
         {"X-Request-Id": "log-me-1"})

    def about_it() -> list[dict]:
        return [line for line in log_lines(log_path) if line["request_id"] == "log-me-1"]

    wait_until(lambda: any(line["logger"] == "http_shim.access" for line in about_it()), "no access line")
    lines = log_lines(log_path)  # every line is one JSON object with the same keys
    assert all({"ts", "level", "logger", "msg", "request_id"} <= set(line) for line in lines)
    mine = about_it()
    assert {line["logger"] for line in mine} == {"http_shim", "http_shim.access"}
    assert any("broke mid-stream" in line["msg"] for line in mine)
    assert any(line["msg"].startswith(f"POST {CHAT} 200") for line in mine)


# ------------------------------------------------------------------ metrics


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics by (name, sorted labels), parsed by prometheus_client's parser."""
    status, headers, body = request(url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_requests_are_counted_by_route_method_and_status(shim):
    before = scrape(shim)
    for _ in range(3):
        assert post(shim, CHAT, {"model": MODEL_ID, "messages": say("hi")})[0] == 200
    assert post(shim, CHAT, {"model": MODEL_ID, "messages": say("hi"), "n": 0})[0] == 400
    assert request(shim, "GET", "/v1/nowhere/at/all")[0] == 404
    assert request(shim, "GET", f"/v1/models/{MODEL_ID}")[0] == 200
    after = scrape(shim)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    total = "conduit:http_requests_total"
    assert delta(total, route=CHAT, method="POST", status="200") == 3
    assert delta(total, route=CHAT, method="POST", status="400") == 1
    assert delta(total, route="other", method="GET", status="404") == 1  # not one series per unknown URL
    assert delta(total, route="/v1/models/<path:model_id>", method="GET", status="200") == 1
    assert delta("conduit:http_request_duration_seconds_count", route=CHAT) == 4
    assert delta("conduit:http_request_duration_seconds_bucket", route=CHAT, le="+Inf") == 4
    assert delta("conduit:http_request_duration_seconds_sum", route=CHAT) > 0
    # The scrape that produced `before` is in `after`; this one is still running.
    assert delta(total, route="/metrics", method="GET", status="200") == 1
    assert value(after, "conduit:http_requests_in_flight") == 1


def test_open_streams_and_client_disconnects(shim, fake):
    before = scrape(shim)
    assert value(before, "conduit:http_streams_in_flight") == 0
    sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("hang"), "stream": True})
    read_until(sock, b'"role":"assistant"')
    assert value(scrape(shim), "conduit:http_streams_in_flight") == 1
    sock.close()  # noticed at the next heartbeat
    wait_until(lambda: value(scrape(shim), "conduit:http_streams_in_flight") == 0, "the stream stayed open")

    # A non-streamed request whose client leaves counts too.
    seen = len(fake.engine.requests)
    sock = open_raw_stream(shim, {"model": MODEL_ID, "messages": say("hang")})
    wait_until(lambda: len(fake.engine.requests) > seen, "the engine got no call")
    sock.close()

    def disconnects() -> float:
        return value(scrape(shim), "conduit:http_client_disconnects_total", route=CHAT) - value(
            before, "conduit:http_client_disconnects_total", route=CHAT)

    wait_until(lambda: disconnects() == 2, "the disconnects were not counted")
    after = scrape(shim)
    assert value(after, "conduit:http_requests_total", route=CHAT, method="POST", status="499") >= 1
    assert value(after, "conduit:http_draining") == 0
