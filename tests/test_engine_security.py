"""The engine's gRPC server (engine_service/serving/background.py) with tokens, TLS and mutual TLS,
reached by the real clients and the real shim; the engine behind it is a small asyncio fake, so
these run in the fast tier. tests/test_hardening_engine_stack.py proves the same on the real engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients import AsyncEngineClient, ConduitError, EngineClient, Unauthenticated, Unavailable
from launcher.stack import TLSFiles
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc
from engine_service.serving.background import BackgroundServer
from engine_service.serving.security import ServerSecurity, TokenAuthInterceptor, collect_tokens
from common import lazy_module
from engine_tls import make_tls_files
from fake_engine import start_shim, stop_process

openai = lazy_module("openai")  # imported by the first test that uses it

TOKEN = "s3cret-token"
OTHER_TOKEN = "second-token"
MODEL_ID = "tiny-fake"
ANSWER = "Paris."


class TinyEngine(engine_pb2_grpc.EngineServicer):
    """An asyncio servicer: one model, and a Generate that answers ANSWER; records each call's metadata."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []
        self.draining_since: float | None = None

    def begin_drain(self, deadline: float) -> None:
        self.draining_since = time.monotonic()

    async def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[pb.ModelInfo(id=MODEL_ID, max_context_length=64, vocab_size=100)])

    async def GetModelInfo(self, request, context):
        return pb.ModelInfo(id=MODEL_ID, max_context_length=64, vocab_size=100)

    async def Generate(self, request, context):
        self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        if self.draining_since is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        rid = request.request_id or "gen-1"
        yield pb.GenerateResponse(request_id=rid, prompt=pb.PromptInfo(prompt_tokens=3))
        yield pb.GenerateResponse(request_id=rid, chunk=pb.Chunk(index=0, text=ANSWER, token_ids=[7],
                                                                  prompt_tokens=3, completion_tokens=1))
        yield pb.GenerateResponse(request_id=rid, final=pb.Final(index=0, finish_reason=pb.FINISH_REASON_STOP,
                                                                  prompt_tokens=3, completion_tokens=1))


def serve(security: ServerSecurity) -> tuple[BackgroundServer, TinyEngine]:
    engine = TinyEngine()
    return BackgroundServer(engine, "127.0.0.1", 0, security=security, description=MODEL_ID).start(), engine


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[TLSFiles, TLSFiles]:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def token_server() -> Iterator[BackgroundServer]:
    server, _ = serve(ServerSecurity(tokens=[TOKEN, OTHER_TOKEN]))
    yield server
    server.stop(grace=0)


@pytest.fixture(scope="module")
def mtls_server(tls: tuple[TLSFiles, TLSFiles]) -> Iterator[BackgroundServer]:
    files = tls[0]
    server, _ = serve(ServerSecurity([TOKEN], files.server_cert, files.server_key, client_ca_file=files.ca))
    yield server
    server.stop(grace=0)


def test_no_token_or_a_wrong_one_is_unauthenticated(token_server: BackgroundServer) -> None:
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
        with EngineClient(token_server.address, token=token, timeout=10) as client:
            with pytest.raises(Unauthenticated) as caught:
                client.list_models()
            assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in caught.value.message
            with pytest.raises(Unauthenticated):
                client.complete(prompt="hi", max_tokens=1)
    with EngineClient(token_server.address, timeout=10, metadata=[("authorization", f"Basic {TOKEN}")]) as client:
        with pytest.raises(Unauthenticated):
            client.list_models()


def test_each_configured_token_works_and_health_needs_none(token_server: BackgroundServer) -> None:
    for token in (TOKEN, OTHER_TOKEN):
        with EngineClient(token_server.address, token=token, timeout=10) as client:
            assert [m.id for m in client.list_models()] == [MODEL_ID]
            assert client.complete(prompt="hi", max_tokens=1).text == ANSWER
    with EngineClient(token_server.address, timeout=10) as anonymous:
        assert anonymous.health() == "SERVING" and anonymous.health("") == "SERVING"


def test_reflection_stays_open(token_server: BackgroundServer) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(token_server.address) as channel:
        assert "conduit.v1.Engine" in ProtoReflectionDescriptorDatabase(channel).get_services()


def test_async_client_sends_its_token(token_server: BackgroundServer) -> None:
    async def main() -> tuple[list[str], type]:
        async with AsyncEngineClient(token_server.address, token=TOKEN, timeout=10) as client:
            ids = [m.id for m in await client.list_models()]
        async with AsyncEngineClient(token_server.address, timeout=10) as client:
            try:
                await client.list_models()
            except ConduitError as error:
                return ids, type(error)
        return ids, type(None)

    assert asyncio.run(main()) == ([MODEL_ID], Unauthenticated)


def test_tls_with_the_ca(tls: tuple[TLSFiles, TLSFiles]) -> None:
    files = tls[0]
    server, _ = serve(ServerSecurity(cert_file=files.server_cert, key_file=files.server_key))
    try:
        with EngineClient(server.address, tls_ca=files.ca, timeout=10) as client:
            assert client.complete(prompt="hi", max_tokens=1).text == ANSWER
        with EngineClient(f"localhost:{server.port}", tls_ca=files.ca, timeout=10) as client:
            assert client.health() == "SERVING"
        with EngineClient(server.address, timeout=5) as plaintext:
            with pytest.raises(Unavailable):
                plaintext.list_models()
        with EngineClient(server.address, tls=True, timeout=5) as system_roots:  # our CA is not a system one
            with pytest.raises(Unavailable):
                system_roots.list_models()
    finally:
        server.stop(grace=0)


def test_mutual_tls_needs_a_client_certificate_from_the_ca(mtls_server: BackgroundServer,
                                                         tls: tuple[TLSFiles, TLSFiles]) -> None:
    files, rogue = tls
    with EngineClient(mtls_server.address, token=TOKEN, timeout=10, **files.client_kwargs()) as client:
        assert client.complete(prompt="hi", max_tokens=1).text == ANSWER
    for kwargs in ({"tls_ca": files.ca}, rogue.client_kwargs()):
        with EngineClient(mtls_server.address, token=TOKEN, timeout=5, **kwargs) as client:
            with pytest.raises(Unavailable):  # the handshake fails: no call reaches the server
                client.list_models()
            with pytest.raises(Unavailable):
                client.health()
    with EngineClient(mtls_server.address, timeout=10, **files.client_kwargs()) as no_token:
        with pytest.raises(Unauthenticated):  # a certificate does not replace the token
            no_token.list_models()


def test_shim_in_front_of_a_secured_engine(mtls_server: BackgroundServer, tls: tuple[TLSFiles, TLSFiles]) -> None:
    files = tls[0]
    process, url = start_shim(mtls_server.address, "--engine-token", TOKEN, *files.shim_args())
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
            response = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "?"}])
        assert response.choices[0].message.content == ANSWER
    finally:
        stop_process(process)


def test_shim_without_the_engine_token_cannot_generate(token_server: BackgroundServer) -> None:
    process, url = start_shim(token_server.address)
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "?"}])
        assert caught.value.status_code == 502, "the shim's credentials are not the user's API key"
        assert caught.value.code == "engine_auth_failed" and "credentials" in caught.value.message
    finally:
        stop_process(process)


def test_drain_turns_health_not_serving_at_once() -> None:
    server, engine = serve(ServerSecurity())
    try:
        with EngineClient(server.address, timeout=10) as client:
            assert client.health() == "SERVING"
            server.begin_drain(time.monotonic() + 30)
            deadline = time.monotonic() + 5
            while client.health() != "NOT_SERVING":
                assert time.monotonic() < deadline, "health still SERVING 5 s after the drain began"
                time.sleep(0.02)
            assert client.health("") == "NOT_SERVING"
            assert engine.draining_since is not None
    finally:
        server.stop(grace=0)


def test_tokens_come_from_flags_and_a_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# team tokens\nfrom-file\n\n  spaced  \n")
    assert collect_tokens(["flag", "flag"], path) == ["flag", "from-file", "spaced"]
    with pytest.raises(ValueError):
        collect_tokens(["two words"])
    with pytest.raises(ValueError):
        ServerSecurity(cert_file="cert.pem")  # no key
    with pytest.raises(ValueError):
        ServerSecurity(client_ca_file="ca.pem")  # mutual TLS without TLS
    with pytest.raises(OSError):  # what the engine CLI checks before loading the model
        ServerSecurity(cert_file=str(tmp_path / "missing.pem"), key_file=str(tmp_path / "missing.key")).credentials()
    interceptor = TokenAuthInterceptor(["abc"])
    assert interceptor.authorized([("authorization", "Bearer abc")])
    assert interceptor.authorized([("authorization", "bearer abc")])
    assert not interceptor.authorized([("authorization", "Bearer abcd")])
    assert not interceptor.authorized([("authorization", "abc")])
    assert not interceptor.authorized([("x-other", "Bearer abc")])
    assert not interceptor.authorized(None)
