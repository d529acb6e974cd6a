"""The shim's /v1/embeddings, /tokenize and /detokenize in front of the fake engine (no model): the
OpenAI shapes (float and base64 as the openai SDK decodes them), the checks the shim makes itself,
the engine's errors under the body's names, and the routes in /openapi.json."""

from __future__ import annotations

import base64
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from common import lazy_module
from fake_engine import MODEL_ID, REFUSED_INPUT, FakeEngineServer, start_shim, stop_process
from http_shim.embeddings.coalesce import MAX_IN_FLIGHT
from http_shim.embeddings.routes import openai_param

openai = lazy_module("openai")  # imported by the first test that uses it


@pytest.fixture(scope="module")
def shim(fake):
    process, url = start_shim(fake.address)
    yield url
    stop_process(process)


@pytest.fixture
def http(shim):
    with httpx.Client(base_url=shim, timeout=30) as client:
        yield client


def test_float_and_base64_shapes(shim, http) -> None:
    body = http.post("/v1/embeddings", json={"model": MODEL_ID, "input": ["one two", "three"]}).json()
    vectors = [item.pop("embedding") for item in body["data"]]  # float32 values, written exactly as doubles
    assert body == {"object": "list", "model": MODEL_ID, "usage": {"prompt_tokens": 3, "total_tokens": 3},
                    "data": [{"object": "embedding", "index": 0}, {"object": "embedding", "index": 1}]}
    assert vectors == [[1.0, struct.unpack("<f", struct.pack("<f", 0.2))[0], 0.0, -1.0],
                       [1.0, struct.unpack("<f", struct.pack("<f", 0.1))[0], 0.0, -1.0]]
    packed = http.post("/v1/embeddings", json={"model": MODEL_ID, "input": "one two",
                                               "encoding_format": "base64"}).json()["data"][0]["embedding"]
    assert struct.unpack("<4f", base64.b64decode(packed)) == pytest.approx((1.0, 0.2, 0.0, -1.0))
    sdk = openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30)
    decoded = sdk.embeddings.create(model=MODEL_ID, input=[[5, 6, 7]])  # the SDK asks for base64 and decodes it
    assert decoded.data[0].embedding == pytest.approx([1.0, 0.3, 0.0, -1.0])
    assert decoded.usage.prompt_tokens == 3
    sdk.close()  # its connection open, the shim's stop would wait for it


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL_ID}, "input"),
    ({"model": MODEL_ID, "input": []}, "input"),
    ({"model": MODEL_ID, "input": [[]]}, "input[0]"),
    ({"model": MODEL_ID, "input": [[1, -2]]}, "input[0]"),
    ({"model": MODEL_ID, "input": [True]}, "input[0]"),
    ({"model": MODEL_ID, "input": ["a", None]}, "input[1]"),
    ({"input": "a"}, "model"),
    ({"model": MODEL_ID, "input": "a", "encoding_format": "float16"}, "encoding_format"),
    ({"model": MODEL_ID, "input": "a", "dimensions": -1}, "dimensions"),
    ({"model": MODEL_ID, "input": "a", "dimensions": 8}, "dimensions"),  # the engine's refusal
    ({"model": MODEL_ID, "input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
])
def test_bad_input_names_its_param(http, body, param) -> None:
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_concurrent_requests_share_an_engine_call_and_keep_their_own_answers(fake, shim, http) -> None:
    """While MAX_IN_FLIGHT calls are out, the requests arriving go as one call; an input the engine
    refuses in it fails only its own request (with its own param), the other gets its own vector."""
    engine, idle = fake.engine, _in_flight(http)
    engine.embed_calls.clear()
    engine.embed_gate.clear()
    try:
        with ThreadPoolExecutor(MAX_IN_FLIGHT + 2) as pool:
            post = lambda body: httpx.post(f"{shim}/v1/embeddings", json={"model": MODEL_ID, **body}, timeout=30)
            held = [pool.submit(post, {"input": "one"}) for _ in range(MAX_IN_FLIGHT)]
            _wait_for(lambda: len(engine.embed_calls) == MAX_IN_FLIGHT)
            good = pool.submit(post, {"input": ["three four five"]})
            bad = pool.submit(post, {"input": ["x", REFUSED_INPUT]})
            _wait_for(lambda: _in_flight(http) == idle + MAX_IN_FLIGHT + 2)
            engine.embed_gate.set()
            assert all(f.result().status_code == 200 for f in held)
            good_response, bad_response = good.result(), bad.result()
    finally:
        engine.embed_gate.set()
    assert engine.embed_calls[:MAX_IN_FLIGHT + 1] == [1] * MAX_IN_FLIGHT + [3]  # the shared call, refused
    assert sorted(engine.embed_calls[MAX_IN_FLIGHT + 1:]) == [1, 2]  # then each alone
    assert good_response.status_code == 200, good_response.text
    assert [d["embedding"] for d in good_response.json()["data"]] == [[1.0, pytest.approx(0.3), 0.0, -1.0]]
    assert good_response.json()["usage"]["prompt_tokens"] == 3
    assert bad_response.status_code == 400 and bad_response.json()["error"]["param"] == "input[1]"


def test_replicas_of_a_model_each_get_their_calls(fake) -> None:
    """Over two replicas, twice the calls run side by side: coalescing must not leave one replica idle."""
    second = FakeEngineServer().start()
    process, url = start_shim(f"{fake.address},{second.address}")
    engines = (fake.engine, second.engine)
    try:
        for engine in engines:
            engine.embed_calls.clear()
            engine.embed_gate.clear()
        with ThreadPoolExecutor(2 * MAX_IN_FLIGHT) as pool:
            answers = [pool.submit(httpx.post, f"{url}/v1/embeddings", json={"model": MODEL_ID, "input": "one"},
                                   timeout=30) for _ in range(2 * MAX_IN_FLIGHT)]
            _wait_for(lambda: sum(len(engine.embed_calls) for engine in engines) == 2 * MAX_IN_FLIGHT)
            for engine in engines:
                engine.embed_gate.set()
            assert all(answer.result().status_code == 200 for answer in answers)
    finally:
        for engine in engines:
            engine.embed_gate.set()
        stop_process(process)
        second.stop()


def _in_flight(http) -> float:
    """The shim's HTTP requests in flight, as its /metrics reports them."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("conduit:http_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no conduit:http_requests_in_flight in /metrics")


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_unknown_model(http) -> None:
    response = http.post("/v1/embeddings", json={"model": "nope", "input": "a"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_tokenize_and_detokenize(http) -> None:
    assert http.post("/tokenize", json={"model": MODEL_ID, "prompt": "a b c"}).json() == {
        "count": 3, "max_model_len": 2048, "tokens": [0, 1, 2]}
    assert http.post("/detokenize", json={"model": MODEL_ID, "tokens": [4, 5]}).json() == {"prompt": "w4 w5"}
    both = http.post("/tokenize", json={"model": MODEL_ID, "prompt": "a",
                                        "messages": [{"role": "user", "content": "b"}]})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"


def test_openapi_describes_the_routes(http) -> None:
    document = http.get("/openapi.json").json()
    assert {"/v1/embeddings", "/tokenize", "/detokenize"} <= set(document["paths"])
    request = document["components"]["schemas"]["EmbeddingRequest"]
    assert request["required"] == ["model", "input"]
    assert request["properties"]["encoding_format"]["enum"] == ["float", "base64"]


def test_engine_params_map_to_the_body() -> None:
    assert openai_param("inputs[3]", one_input=False) == "input[3]"
    assert openai_param("inputs[0]", one_input=True) == "input"
    assert openai_param("inputs", one_input=False) == "input"
    assert openai_param("dimensions", one_input=True) == "dimensions"


def test_run_stack_serves_the_embedding_model_beside_the_chat_model() -> None:
    """`make run-stack` (conduit-stack) adds all-MiniLM-L6-v2's engine, after the chat engines' ports,
    behind the same shim; EMBEDDING_MODEL=none leaves it out. A Stack's default starts none."""
    from launcher.stack import Stack, build_parser

    args = build_parser().parse_args(["--engine-port", "7100", "--replicas", "2"])
    assert args.embedding_model == "all-MiniLM-L6-v2"
    stack = Stack(engine_port=7100, replicas=2, embedding_model=args.embedding_model, embedding_port=7102)
    assert stack.shim_command()[stack.shim_command().index("--engine") + 1] == \
        "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102"
    assert stack.embedding_command()[stack.embedding_command().index("--model") + 1] == "all-MiniLM-L6-v2"
    assert Stack(engine_port=7100).embedding_address is None
    assert build_parser().parse_args(["--embedding-model", "none"]).embedding_model == "none"


def test_the_shim_listens_without_nagles_delay(monkeypatch) -> None:
    """Small responses (an embedding, the model list) took ~40 ms more than their work: headers and
    body are separate writes, and Nagle's algorithm held the body for the client's delayed ACK.
    The listener sets TCP_NODELAY, which its accepted connections inherit."""
    import socket

    import gevent

    from http_shim import server as shim_server

    seen = {}

    def serve_forever(self) -> None:
        seen["nodelay"] = self.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        self.stop()

    monkeypatch.setattr(shim_server.WSGIServer, "serve_forever", serve_forever)
    monkeypatch.setattr(gevent, "signal_handler", lambda *args: None)

    class App:
        state = type("State", (), {"drain": None})()

    shim_server.serve(App(), "127.0.0.1", 0)  # type: ignore[arg-type]
    assert seen["nodelay"] == 1
