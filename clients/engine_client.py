"""Typed clients for the Conduit engine: `EngineClient` (blocking) and `AsyncEngineClient` (asyncio).

Both wrap the generated `conduit.v1.Engine` stub and the standard health service,
apply a default deadline and metadata to every call, and raise `ConduitError`
subclasses instead of `grpc.RpcError`. A Generate stream that is closed early
(or garbage collected) cancels its call, which stops generation in the engine.
Channels allow the contract's 64 MiB messages and send keepalive pings (an engine that stops
answering fails its calls within ~10 s: conduit.v1.contract) unless `options` say otherwise.
The blocking client also serves the HTTP shim, under gevent.

A secured engine: `token=` sends `authorization: Bearer <token>` with every call; `tls_ca=`
(the CA that signed the engine's certificate; `tls=True` alone trusts the system's CAs) makes
the channel TLS, and `tls_cert=`/`tls_key=` present a client certificate (mutual TLS).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.call_attempts import AttemptedCall
from clients.errors import from_rpc_error
from clients.http_proxy import proxy_options
from clients.many_calls import ManyCallsChannel
from clients.replicas import channel_target, replica_options, spans_replicas
from clients.request_builder import Message, ToolSpec, build_request, embed_request, tokenize_request
from conduit_common.results import Completion, CompletionBuilder
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc
from conduit.v1.contract import AUTHORIZATION_METADATA_KEY, ENGINE_SERVICE, MESSAGE_SIZE_OPTIONS, keepalive_options

Metadata = Sequence[tuple[str, str]]
ChannelOptions = Sequence[tuple[str, Any]]
PathLike = str | Path


def _channel_options(target: str, options: ChannelOptions, tls_server_name: str | None = None,
                     proxy: str | None = None) -> list[tuple[str, Any]]:
    """The contract's message size limits and keepalive (a dead engine fails its calls rather than
    leaving them waiting), the replica service config (round robin, health checking, retries of
    calls that produced nothing), no HTTP proxy but the `proxy` named (clients/http_proxy.py),
    overridden by the caller's `options`."""
    extra = {"grpc.ssl_target_name_override": tls_server_name} if tls_server_name else {}
    defaults = {**dict(MESSAGE_SIZE_OPTIONS), **dict(keepalive_options()), **dict(replica_options(target)),
                **dict(proxy_options(target, proxy))}
    return list({**defaults, **extra, **dict(options)}.items())


def tls_credentials(ca: PathLike | None = None, cert: PathLike | None = None,
                    key: PathLike | None = None) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: `ca` verifies the engine (None: the system's
    CAs); `cert` and `key` are this client's certificate for mutual TLS."""
    if bool(cert) != bool(key):
        raise ValueError("a client certificate (tls_cert) needs its key (tls_key), and the other way round")

    def read(path: PathLike | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                        certificate_chain=read(cert))


def _security(credentials: grpc.ChannelCredentials | None, token: str | None, tls: bool, tls_ca: PathLike | None,
              tls_cert: PathLike | None, tls_key: PathLike | None,
              metadata: Metadata) -> tuple[grpc.ChannelCredentials | None, Metadata]:
    """The channel's credentials (None: plaintext) and the default metadata, with the token."""
    if credentials is None and (tls or tls_ca or tls_cert or tls_key):
        credentials = tls_credentials(tls_ca, tls_cert, tls_key)
    if token:
        metadata = [(AUTHORIZATION_METADATA_KEY, f"Bearer {token}"), *metadata]
    return credentials, metadata


class _Options:
    """Defaults shared by both clients: deadline, metadata and request building."""

    def __init__(self, timeout: float | None, metadata: Metadata) -> None:
        self.timeout = timeout
        self.metadata = tuple(metadata)

    def call_options(self, timeout: float | None, metadata: Metadata | None) -> dict[str, Any]:
        return {"timeout": self.timeout if timeout is None else timeout,
                "metadata": self.metadata + tuple(metadata or ())}

    @staticmethod
    def generate_request(request: pb.GenerateRequest | None, params: dict[str, Any]) -> pb.GenerateRequest:
        if request is None:
            return build_request(**params)
        if params:
            raise TypeError("pass either a GenerateRequest or keyword arguments, not both")
        return request


class GenerateStream:
    """The responses of one Generate call, in order; `close()` cancels the call."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> GenerateStream:
        return self

    def __next__(self) -> pb.GenerateResponse:
        try:
            return next(self._call)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    def close(self) -> None:
        """Cancel the call if it is still running (a no-op once it has ended)."""
        self._call.cancel()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EngineClient:
    """Blocking client. Use as a context manager, or call `close()`."""

    def __init__(self, target: str | Sequence[str] = "127.0.0.1:50051", *,
                 token: str | None = None, tls: bool = False, tls_ca: PathLike | None = None,
                 tls_cert: PathLike | None = None, tls_key: PathLike | None = None,
                 tls_server_name: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: ChannelOptions = (), proxy: str | None = None,
                 timeout: float | None = None, metadata: Metadata = ()) -> None:
        """`timeout` (seconds) and `metadata` apply to every call unless a call overrides them.
        `target` is one address, a gRPC URI such as dns:///engine:50051, or several replicas
        (a list or "A,B"): calls go round robin to the replicas whose health is SERVING, and a
        call that fails with UNAVAILABLE before any answer is retried on another (clients/replicas.py).
        `token`, `tls*` reach a secured engine (see the module docstring); `tls_server_name`
        is the name to expect in its certificate when `target` does not carry it; `credentials`
        replace the ones the tls_* files would make. The channel takes no HTTP proxy from the
        environment; `proxy` (http://HOST:PORT) names one for it (clients/http_proxy.py)."""
        credentials, metadata = _security(credentials, token, tls, tls_ca, tls_cert, tls_key, metadata)
        target = channel_target(target)
        self._spans_replicas = spans_replicas(target)
        options = _channel_options(target, options, tls_server_name, proxy)
        self._channel = (grpc.secure_channel(target, credentials, options) if credentials
                         else grpc.insecure_channel(target, options))
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._options = _Options(timeout, metadata)
        self._many = ManyCallsChannel(self._stub, self._options.metadata, self.generate)

    def generate(self, request: pb.GenerateRequest | None = None, /, *, timeout: float | None = None,
                 metadata: Metadata | None = None, **params: Any) -> GenerateStream:
        """Stream GenerateResponse messages; `params` go to `build_request` when no request is given."""
        call = self._stub.Generate(self._options.generate_request(request, params),
                                   **self._options.call_options(timeout, metadata))
        return GenerateStream(call)

    def generate_shared(self, request: pb.GenerateRequest, /, *, timeout: float | None = None,
                        metadata: Metadata | None = None, retries: bool = True) -> AttemptedCall | GenerateStream:
        """As `generate`, but the call travels with this client's other shared calls on one
        GenerateMany stream: for relays, which then receive one message per engine step rather
        than one per call (clients/many_calls.py). On a channel over several replicas it is a
        plain Generate call, so that calls still spread over them (one stream reaches one).
        `retries=False`: a refusal is not sent to this engine again (a router that sends it
        elsewhere owns the call's retries)."""
        if self._spans_replicas:
            return self.generate(request, timeout=timeout, metadata=metadata)
        options = self._options.call_options(timeout, metadata)
        return self._many.generate(request, timeout=options["timeout"], metadata=tuple(metadata or ()),
                                   retries=retries)

    def complete(self, request: pb.GenerateRequest | None = None, /, *, timeout: float | None = None,
                 metadata: Metadata | None = None, **params: Any) -> Completion:
        """Run a generation to the end and return text, finish reason and usage per choice."""
        builder = CompletionBuilder()
        with self.generate(request, timeout=timeout, metadata=metadata, **params) as stream:
            for response in stream:
                builder.add(response)
        return builder.build()

    def list_models(self, *, timeout: float | None = None, metadata: Metadata | None = None,
                    wait_for_ready: bool = False) -> list[pb.ModelInfo]:
        """`wait_for_ready`: an engine not reachable yet (starting, or its channel waiting to
        reconnect) is waited for, up to the timeout, instead of failing at once."""
        try:
            return list(self._stub.ListModels(pb.ListModelsRequest(), wait_for_ready=wait_for_ready,
                                              **self._options.call_options(timeout, metadata)).models)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    def model_info(self, model: str = "", *, timeout: float | None = None,
                   metadata: Metadata | None = None) -> pb.ModelInfo:
        """Details of `model` (empty: the served model); NotFound when unknown."""
        return self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(model=model), timeout, metadata)

    def tokenize(self, text: str | None = None, *, messages: Iterable[Message] | None = None, model: str = "",
                 timeout: float | None = None, metadata: Metadata | None = None,
                 tools: Sequence[ToolSpec] = (), request: pb.TokenizeRequest | None = None) -> pb.TokenizeResponse:
        """Token ids of a text, or of a chat (with its tools) rendered exactly as Generate renders it;
        `request`: a whole TokenizeRequest instead (tool choice, answer format)."""
        request = request or tokenize_request(text=text, messages=messages, model=model, tools=tools)
        return self._unary(self._stub.Tokenize, request, timeout, metadata)

    def detokenize(self, token_ids: Sequence[int], *, model: str = "", timeout: float | None = None,
                   metadata: Metadata | None = None) -> str:
        request = pb.DetokenizeRequest(model=model, token_ids=token_ids)
        return self._unary(self._stub.Detokenize, request, timeout, metadata).text

    def embed(self, inputs: str | Sequence[str | Sequence[int]] = (), *, model: str = "",
              dimensions: int | None = None, truncate_prompt_tokens: int | None = None,
              timeout: float | None = None, metadata: Metadata | None = None,
              request: pb.EmbedRequest | None = None) -> pb.EmbedResponse:
        """One vector per input (a text, or the model's token ids) from an embedding model's engine;
        `request`: a whole EmbedRequest instead. InvalidArgument names the input at fault."""
        request = request or embed_request(inputs, model=model, dimensions=dimensions,
                                           truncate_prompt_tokens=truncate_prompt_tokens)
        return self._unary(self._stub.Embed, request, timeout, metadata)

    def load_adapter(self, name: str, path: str, *, timeout: float | None = None,
                     metadata: Metadata | None = None) -> pb.ModelInfo:
        """Loads the LoRA adapter in folder `path` (on the engine's host, under its --lora-dirs) as model `name`;
        its ModelInfo. A ConduitError whose message names the problem when refused: code FAILED_PRECONDITION
        (runtime loading off), PERMISSION_DENIED (outside --lora-dirs), NOT_FOUND, INVALID_ARGUMENT."""
        return self._unary(self._stub.LoadAdapter, pb.LoadAdapterRequest(name=name, path=path), timeout, metadata)

    def unload_adapter(self, name: str, *, timeout: float | None = None, metadata: Metadata | None = None) -> None:
        """Unloads LoRA adapter `name` (its running requests finish); NotFound when it is not loaded."""
        self._unary(self._stub.UnloadAdapter, pb.UnloadAdapterRequest(name=name), timeout, metadata)

    def load(self, *, timeout: float | None = None, metadata: Metadata | None = None) -> pb.LoadReport:
        """The engine's running and waiting requests, KV-cache usage and layout (GetLoad), for routers."""
        return self._unary(self._stub.GetLoad, pb.GetLoadRequest(), timeout, metadata)

    def kv_events(self, start_sequence_number: int = 0, *, metadata: Metadata | None = None) -> GenerateStream:
        """The engine's prefix-cache events (vllm.grpc.engine's SubscribeKvEvents, smg-grpc-proto's
        KvEventBatch), for routers: what it holds, then each block stored and removed, until closed.
        UNIMPLEMENTED from an engine that does not publish them."""
        from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc  # only routers need it

        stub = vllm_engine_pb2_grpc.VllmEngineStub(self._channel)
        options = self._options.call_options(None, metadata)
        options["timeout"] = None  # it runs for the engine's life
        return GenerateStream(stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=start_sequence_number), **options))

    def health(self, service: str = ENGINE_SERVICE, *, timeout: float | None = None,
               metadata: Metadata | None = None) -> str:
        """The grpc.health.v1 status name: "SERVING" once the model is loaded, else "NOT_SERVING"."""
        response = self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                               timeout, metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def close(self) -> None:
        self._many.close()
        self._channel.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, timeout: float | None, metadata: Metadata | None) -> Any:
        try:
            return method(request, **self._options.call_options(timeout, metadata))
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error


class AsyncGenerateStream:
    """The responses of one Generate call, for `async for`; `close()` cancels the call."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call

    def __aiter__(self) -> AsyncGenerateStream:
        return self

    async def __anext__(self) -> pb.GenerateResponse:
        try:
            response = await self._call.read()
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error
        if response is grpc.aio.EOF:
            raise StopAsyncIteration
        return response

    def close(self) -> None:
        """Cancel the call if it is still running (a no-op once it has ended)."""
        self._call.cancel()

    async def __aenter__(self) -> AsyncGenerateStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


class AsyncEngineClient:
    """asyncio client over grpc.aio; create it inside the running event loop."""

    def __init__(self, target: str | Sequence[str] = "127.0.0.1:50051", *,
                 token: str | None = None, tls: bool = False, tls_ca: PathLike | None = None,
                 tls_cert: PathLike | None = None, tls_key: PathLike | None = None,
                 tls_server_name: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: ChannelOptions = (), proxy: str | None = None,
                 timeout: float | None = None, metadata: Metadata = ()) -> None:
        """The same arguments as EngineClient's."""
        credentials, metadata = _security(credentials, token, tls, tls_ca, tls_cert, tls_key, metadata)
        target = channel_target(target)
        options = _channel_options(target, options, tls_server_name, proxy)
        self._channel = (grpc.aio.secure_channel(target, credentials, options) if credentials
                         else grpc.aio.insecure_channel(target, options))
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._options = _Options(timeout, metadata)

    def generate(self, request: pb.GenerateRequest | None = None, /, *, timeout: float | None = None,
                 metadata: Metadata | None = None, **params: Any) -> AsyncGenerateStream:
        """Stream GenerateResponse messages; `params` go to `build_request` when no request is given."""
        call = self._stub.Generate(self._options.generate_request(request, params),
                                   **self._options.call_options(timeout, metadata))
        return AsyncGenerateStream(call)

    async def complete(self, request: pb.GenerateRequest | None = None, /, *, timeout: float | None = None,
                       metadata: Metadata | None = None, **params: Any) -> Completion:
        """Run a generation to the end and return text, finish reason and usage per choice."""
        builder = CompletionBuilder()
        async with self.generate(request, timeout=timeout, metadata=metadata, **params) as stream:
            async for response in stream:
                builder.add(response)
        return builder.build()

    async def list_models(self, *, timeout: float | None = None,
                          metadata: Metadata | None = None) -> list[pb.ModelInfo]:
        response = await self._unary(self._stub.ListModels, pb.ListModelsRequest(), timeout, metadata)
        return list(response.models)

    async def model_info(self, model: str = "", *, timeout: float | None = None,
                         metadata: Metadata | None = None) -> pb.ModelInfo:
        return await self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest(model=model), timeout, metadata)

    async def tokenize(self, text: str | None = None, *, messages: Iterable[Message] | None = None,
                       model: str = "", timeout: float | None = None,
                       metadata: Metadata | None = None,
                       request: pb.TokenizeRequest | None = None) -> pb.TokenizeResponse:
        request = request or tokenize_request(text=text, messages=messages, model=model)
        return await self._unary(self._stub.Tokenize, request, timeout, metadata)

    async def detokenize(self, token_ids: Sequence[int], *, model: str = "", timeout: float | None = None,
                         metadata: Metadata | None = None) -> str:
        request = pb.DetokenizeRequest(model=model, token_ids=token_ids)
        return (await self._unary(self._stub.Detokenize, request, timeout, metadata)).text

    async def embed(self, inputs: str | Sequence[str | Sequence[int]] = (), *, model: str = "",
                    dimensions: int | None = None, truncate_prompt_tokens: int | None = None,
                    timeout: float | None = None, metadata: Metadata | None = None,
                    request: pb.EmbedRequest | None = None) -> pb.EmbedResponse:
        request = request or embed_request(inputs, model=model, dimensions=dimensions,
                                           truncate_prompt_tokens=truncate_prompt_tokens)
        return await self._unary(self._stub.Embed, request, timeout, metadata)

    async def load_adapter(self, name: str, path: str, *, timeout: float | None = None,
                           metadata: Metadata | None = None) -> pb.ModelInfo:
        """As EngineClient.load_adapter."""
        return await self._unary(self._stub.LoadAdapter, pb.LoadAdapterRequest(name=name, path=path), timeout,
                                 metadata)

    async def unload_adapter(self, name: str, *, timeout: float | None = None,
                             metadata: Metadata | None = None) -> None:
        """As EngineClient.unload_adapter."""
        await self._unary(self._stub.UnloadAdapter, pb.UnloadAdapterRequest(name=name), timeout, metadata)

    async def health(self, service: str = ENGINE_SERVICE, *, timeout: float | None = None,
                     metadata: Metadata | None = None) -> str:
        response = await self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                                     timeout, metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout: float | None, metadata: Metadata | None) -> Any:
        try:
            return await method(request, **self._options.call_options(timeout, metadata))
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error
