"""Models, tokens, health, reflection and errors through the Python gRPC client."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from clients import DeadlineExceeded, EngineClient, InvalidArgument, NotFound
from launcher.stack import Stack
from common import MODEL, QUESTION

pytestmark = pytest.mark.model


def test_models(engine_client: EngineClient) -> None:
    models = engine_client.list_models()
    assert [model.id for model in models] == [MODEL]
    info = engine_client.model_info(MODEL)
    assert info == engine_client.model_info() == models[0]
    assert info.max_context_length == 8192
    assert info.vocab_size > 0
    assert list(info.eos_token_ids)
    assert info.created > 0


def test_tokenize_round_trip(engine_client: EngineClient) -> None:
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé ✓"
    response = engine_client.tokenize(text)
    assert len(response.token_ids) == len(response.tokens) > 5
    assert response.max_context_length == 8192
    assert engine_client.detokenize(response.token_ids) == text


def test_tokenize_chat_uses_the_template(engine_client: EngineClient) -> None:
    chat = engine_client.tokenize(messages=QUESTION).token_ids
    plain = engine_client.tokenize(QUESTION[0]["content"]).token_ids
    assert len(chat) > len(plain)
    assert QUESTION[0]["content"] in engine_client.detokenize(chat)


def test_health(engine_client: EngineClient) -> None:
    assert engine_client.health("") == "SERVING"
    assert engine_client.health("conduit.v1.Engine") == "SERVING"
    with pytest.raises(NotFound):
        engine_client.health("no.such.Service")


def test_reflection_lists_the_services(stack: Stack) -> None:
    with grpc.insecure_channel(stack.engine_address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert {"conduit.v1.Engine", "grpc.health.v1.Health"} <= set(services)
        pool = descriptor_pool.DescriptorPool(database)
        generate = pool.FindServiceByName("conduit.v1.Engine").methods_by_name["Generate"]
        assert generate.server_streaming and not generate.client_streaming
        assert generate.output_type.full_name == "conduit.v1.GenerateResponse"


def test_prompt_over_the_context_is_invalid(engine_client: EngineClient) -> None:
    with pytest.raises(InvalidArgument) as caught:
        engine_client.complete(token_ids=[100] * 9000, max_tokens=4)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.message
    with pytest.raises(InvalidArgument):
        engine_client.complete(prompt="hello " * 9000, max_tokens=4)


@pytest.mark.parametrize("params", [
    {"temperature": 5.0},
    {"top_p": 0.0},
    {"n": 17},
    {"top_logprobs": 21, "logprobs": True},
    {"messages": []},
    {"stop": ["x"] * 17},
], ids=lambda params: ",".join(params))
def test_bad_parameters_are_invalid(engine_client: EngineClient, params: dict) -> None:
    request = {"messages": QUESTION, "max_tokens": 4, **params}
    with pytest.raises(InvalidArgument) as caught:
        engine_client.complete(**request)
    assert caught.value.message


def test_unknown_model_is_not_found(engine_client: EngineClient) -> None:
    with pytest.raises(NotFound) as caught:
        engine_client.complete(messages=QUESTION, model="no-such-model", max_tokens=4)
    assert "no-such-model" in caught.value.message
    with pytest.raises(NotFound):
        engine_client.model_info("no-such-model")
    with pytest.raises(NotFound):
        engine_client.tokenize("hi", model="no-such-model")


def test_client_default_deadline_applies(stack: Stack) -> None:
    with EngineClient(stack.engine_address, timeout=1.0, metadata=[("x-team", "tests")]) as engine:
        with pytest.raises(DeadlineExceeded):
            engine.complete(messages=QUESTION, ignore_eos=True, max_tokens=4000, metadata=[("x-call", "1")])
