"""The Shepherd Model Gateway (`smg`, the real one from PyPI) in front of two real Conduit engines
(default model) as its gRPC workers, driven with the openai and anthropic SDKs.

The gateway tokenizes, applies the chat template, parses tool calls and detokenizes; the engines
take and return token ids over vllm.grpc.engine.VllmEngine (engine_service/serving/vllm_worker.py).
Its cache-aware policy reads each engine's prefix cache from SubscribeKvEvents (its
`event_hit` branch), so a prompt whose prefix an engine holds goes there: `cached_tokens` shows it.
Also the other topology: a gateway in front of the Stack's shim as an HTTP worker.
Started once for the module: two engines and a shim (a Stack), and the gateway.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator

import anthropic
import grpc
import jsonschema
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2 as vpb, vllm_engine_pb2_grpc as vpb_grpc

from launcher.stack import Stack
from engine_service.core.config import EngineConfig
from launcher.smg_gateway import Gateway
from common import ANSWER, ASK_MAX_TOKENS, MODEL, PROMPT, QUESTION, STORY, WEATHER_QUESTION
from conftest import STARTUP_TIMEOUT_S

SEGMENTS = EngineConfig().segments

pytestmark = [pytest.mark.model, pytest.mark.slow]  # slow: drives an outside tool (the gateway)

WAIT_S = 60.0
STREAMS = 4
STREAM_TOKENS = 96  # long enough to be mid-stream when the kill lands
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Gateway]]:
    logs = tmp_path_factory.mktemp("logs")
    with Stack(replicas=2, log_dir=logs, startup_timeout=STARTUP_TIMEOUT_S) as engines:
        info = worker(engines, 0).GetModelInfo(vpb.GetModelInfoRequest())
        with Gateway(engines.engine_addresses, info.tokenizer_path, logs / "smg.log") as gateway:
            yield engines, gateway


@pytest.fixture(scope="module")
def client(fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet[1].base_url, api_key="unused", max_retries=0, timeout=WAIT_S)


def worker(engines: Stack, index: int) -> vpb_grpc.VllmEngineStub:
    return vpb_grpc.VllmEngineStub(grpc.insecure_channel(engines.engine_addresses[index]))


def running(engines: Stack) -> list[int]:
    return [worker(engines, i).GetLoads(vpb.GetLoadsRequest()).loads[0].num_running_reqs for i in range(2)]


def test_chat_streaming_and_completions_through_the_gateway(client):
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=ASK_MAX_TOKENS)
    assert (response.choices[0].message.content, response.choices[0].finish_reason) == (ANSWER, "stop")
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens == 8

    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                                 max_tokens=ASK_MAX_TOKENS, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert chunks[-1].usage.completion_tokens == 8

    two = client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, temperature=0, max_tokens=ASK_MAX_TOKENS)
    assert [c.message.content for c in two.choices] == [ANSWER, ANSWER]

    completion = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5)
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason == "length" and completion.usage.completion_tokens == 5

    scored = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=3,
                                            logprobs=True, top_logprobs=2)
    tokens = scored.choices[0].logprobs.content
    assert len(tokens) == 3 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
    assert "".join(t.token for t in tokens) == scored.choices[0].message.content


def test_a_forced_tool_call_and_structured_output(client):
    called = client.chat.completions.create(
        model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], temperature=0, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)

    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=0, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)


def test_anthropic_messages_plain_and_streamed(fleet):
    client = anthropic.Anthropic(base_url=fleet[1].url, api_key="unused", max_retries=0, timeout=WAIT_S)
    message = client.messages.create(model=MODEL, max_tokens=ASK_MAX_TOKENS, messages=QUESTION)
    assert message.content[0].text and message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=10, messages=QUESTION) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.stop_reason in ("end_turn", "max_tokens")


def test_a_client_that_leaves_frees_the_engines_slot(fleet, client):
    engines, _ = fleet
    stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2000, stream=True,
                                            extra_body={"ignore_eos": True})
    for index, _chunk in enumerate(stream):
        if index == 3:
            break
    assert sum(running(engines)) == 1
    stream.response.close()
    deadline = time.monotonic() + WAIT_S
    while sum(running(engines)):
        assert time.monotonic() < deadline, "the engine kept generating for a client that left"
        time.sleep(0.1)


def test_cache_aware_routing_keeps_a_shared_prefix_on_the_engine_that_holds_it(fleet, client):
    """Four documents, three questions each: every follow-up lands where its document is cached
    (round robin would put the second on the other engine, with nothing cached)."""
    _, gateway = fleet
    hits_before = gateway.metric('smg_cache_aware_policy_branch_total{branch="event_hit"}')
    for doc in range(4):
        words = " ".join(f"w{doc}x{i}" for i in range(60))
        system = {"role": "system", "content": f"Document {doc}: {words}"}
        cached = []
        for question in range(3):
            response = client.chat.completions.create(
                model=MODEL, messages=[system, {"role": "user", "content": f"Question {question}: one word?"}],
                temperature=0, max_tokens=2)
            cached.append(response.usage.prompt_tokens_details.cached_tokens)
        # All but the question and the block it falls in, to a prompt segment's boundary (model/step.py).
        prefix = SEGMENTS.floor(response.usage.prompt_tokens - 2 * 16)
        assert all(tokens >= prefix for tokens in cached[1:]), cached
    assert gateway.metric('smg_cache_aware_policy_branch_total{branch="event_hit"}') >= hits_before + 8, \
        "the gateway routed by the engines' KV events"


def test_get_tokenizer_streams_the_served_tokenizer_as_a_checked_zip(fleet):
    chunks = list(worker(fleet[0], 1).GetTokenizer(common_pb2.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert [bool(c.sha256) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= set(names)


def test_the_gateway_in_front_of_a_shim_as_an_http_worker(fleet, tmp_path):
    """The other topology: the shim is a generic HTTP worker; the gateway passes the OpenAI calls on."""
    engines, _ = fleet
    model_path = worker(engines, 0).GetModelInfo(vpb.GetModelInfoRequest()).tokenizer_path
    with Gateway([engines.shim_url], model_path, tmp_path / "smg-http.log", policy="round_robin") as gateway:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
        response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                                  max_tokens=ASK_MAX_TOKENS)
        assert response.choices[0].message.content == ANSWER
        chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                                     max_tokens=ASK_MAX_TOKENS, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER


def generate(engines: Stack, index: int, prompt: list[int], **sampling) -> vpb.GenerateRequest:
    return vpb.GenerateRequest(request_id=f"direct-{time.monotonic_ns()}", tokenized=vpb.TokenizedInput(
        input_ids=prompt), stream=True, sampling_params=vpb.SamplingParams(**sampling))


def test_the_worker_service_directly_refuses_by_name_aborts_and_flushes(fleet):
    engines, _ = fleet
    stub, prompt = worker(engines, 1), list(range(100, 180))
    with grpc.insecure_channel(engines.engine_addresses[1]) as channel:
        assert "vllm.grpc.engine.VllmEngine" in ProtoReflectionDescriptorDatabase(channel).get_services()
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(
            service="vllm.grpc.engine.VllmEngine"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    for sampling, code, words in [({"structural_tag": "{}"}, grpc.StatusCode.UNIMPLEMENTED, "structural_tag"),
                                  ({"temperature": 5.0}, grpc.StatusCode.INVALID_ARGUMENT,
                                   "sampling_params.temperature"),
                                  ({"json_schema": "{"}, grpc.StatusCode.INVALID_ARGUMENT, "json_schema")]:
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(generate(engines, 1, prompt, max_tokens=2, **sampling)))
        assert refused.value.code() == code and words in refused.value.details()

    request = generate(engines, 1, prompt, max_tokens=1000, ignore_eos=True)
    stream = stub.Generate(request)
    assert next(stream).chunk.token_ids
    stub.Abort(vpb.AbortRequest(request_ids=[request.request_id]))
    finals = [r.complete for r in stream if r.HasField("complete")]
    assert [f.finish_reason for f in finals] == ["abort"] and finals[0].completion_tokens < 1000

    def cached() -> int:
        request = generate(engines, 1, prompt, max_tokens=1, temperature=0)
        return [r.complete for r in stub.Generate(request) if r.HasField("complete")][0].cached_tokens
    assert cached() > 0, "the prompt was computed above: its blocks are cached"
    assert stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=10)).success
    assert cached() == 0


def test_a_replica_killed_under_load_loses_no_request_that_had_not_started(fleet, client):
    """Last in the module: it leaves one engine. Streams cut by the kill end in an error, never as a
    short success; every request sent after it is served by the survivor."""
    engines, _ = fleet
    outcomes: list[str] = []

    def stream(index: int) -> None:
        try:
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"Story {index}: tell me about a lighthouse."}],
                max_tokens=STREAM_TOKENS, stream=True, extra_body={"ignore_eos": True},
                stream_options={"include_usage": True}))
        except openai.APIError as exc:
            outcomes.append(f"error: {type(exc).__name__}")
            return
        usage, reasons = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices]
        outcomes.append("full" if usage and usage.completion_tokens == STREAM_TOKENS and "length" in reasons
                        else f"short: {usage}, {reasons}")

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT_S
    while sum(loads := running(engines)) < STREAMS:
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads), loads
        time.sleep(0.05)
    victim = max(range(2), key=lambda i: loads[i])
    engines.engines[victim].kill()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(outcomes) == STREAMS and all(o == "full" or o.startswith("error") for o in outcomes), outcomes
    assert outcomes.count("full") >= STREAMS - loads[victim], outcomes

    for _ in range(6):
        response = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                                  max_tokens=ASK_MAX_TOKENS)
        assert response.choices[0].message.content == ANSWER
