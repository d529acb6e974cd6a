"""The gRPC face of the engine: conduit.v1.Engine, grpc.health.v1 and reflection."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc
from conduit.v1.contract import ENGINE_SERVICE, ERROR_CODE_METADATA_KEY, MESSAGE_SIZE_OPTIONS, PARAM_METADATA_KEY
from engine_service.text import prompts
from engine_service.serving.convert import EventEncoder, request_params
from engine_service.core.engine import Engine
from engine_service.core.params import InvalidRequest, QueueFull
from engine_service.core.events import FinalEvent, FinishReason
from engine_service.core.sequence import Request
from engine_service.text.tools import ToolSpec

log = logging.getLogger(__name__)

async def abort_invalid(context: grpc.aio.ServicerContext, exc: InvalidRequest, input_kind: str | None) -> None:
    """INVALID_ARGUMENT, naming the field at fault in trailing metadata (`conduit-param`,
    a proto field path) and the kind of error (`conduit-error-code`) when known."""
    param = exc.param
    if param == "input" and input_kind:
        param = "chat.messages" if input_kind == "chat" else input_kind
    metadata = [(PARAM_METADATA_KEY, param)] if param else []
    if exc.code:
        metadata.append((ERROR_CODE_METADATA_KEY, exc.code))
    context.set_trailing_metadata(metadata)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


class EngineServicer(pb_grpc.EngineServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.loaded = engine.loaded
        self.created = int(time.time())

    async def _check_model(self, model: str, context: grpc.aio.ServicerContext) -> None:
        if model and model != self.loaded.model_id:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"model {model!r} is not served here; this engine serves {self.loaded.model_id!r}")

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        await self._check_model(request.model, context)
        request_id = request.request_id or f"gen-{uuid.uuid4().hex}"
        queue: asyncio.Queue[list] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        try:
            job = await self._submit(request, request_id,
                                     sink=lambda events: loop.call_soon_threadsafe(queue.put_nowait, events))
        except InvalidRequest as exc:
            await abort_invalid(context, exc, request.WhichOneof("input"))
            return
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        encoder = EventEncoder(request_id, self.engine.token_table, echo=job.params.echo,
                               decode=self.engine.tokenizer.decode)
        remaining = job.params.n
        try:
            while remaining:
                for event in await queue.get():
                    if isinstance(event, FinalEvent):
                        if event.finish_reason is FinishReason.CANCELLED:
                            await context.abort(grpc.StatusCode.INTERNAL, "the engine failed while generating")
                            return
                        remaining -= 1
                    message = encoder.encode(event)
                    if message is not None:
                        yield message
        finally:
            # Client gone, deadline passed or stream done: the engine frees the slot next step.
            if not job.finished:
                self.engine.abort(job.request_id)

    async def _submit(self, request: pb.GenerateRequest, request_id: str, sink) -> Request:
        """The engine's request for a GenerateRequest, queued. Raises InvalidRequest or QueueFull."""
        ids = prompts.prompt_ids(self.engine.tokenizer, request)
        params = request_params(request)
        tools = ToolSpec.from_chat(request.chat) if request.WhichOneof("input") == "chat" else None
        grammar = await asyncio.to_thread(self._grammar, request, tools)
        job = Request(request_id=f"{request_id}/{uuid.uuid4().hex[:8]}", prompt_ids=ids, params=params,
                      max_tokens=0, sink=sink, grammar=grammar, tools=tools)
        self.engine.submit(job)
        return job

    def _grammar(self, request: pb.GenerateRequest, tools: ToolSpec | None) -> str | None:
        """The request's constraint, or the forced tool-call shape; validated (may take ~100 ms)."""
        grammar = self.engine.grammars.grammar_for(request.constraint)
        if tools is not None and tools.forced:
            if grammar is not None:
                raise InvalidRequest("a constraint cannot be combined with a required tool call", "constraint")
            grammar = tools.grammar()
        if grammar is not None:
            self.engine.grammars.validate(grammar)
        return grammar

    def _model_info(self) -> pb.ModelInfo:
        return pb.ModelInfo(
            id=self.loaded.model_id, source=self.loaded.source, max_context_length=self.engine.max_model_len,
            vocab_size=self.engine.vocab_size, dtype=str(self.loaded.dtype).removeprefix("torch."),
            device=str(self.loaded.device), created=self.created, eos_token_ids=self.loaded.eos_token_ids)

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[self._model_info()])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        await self._check_model(request.model, context)
        return self._model_info()

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        await self._check_model(request.model, context)
        try:
            ids = prompts.prompt_ids(self.engine.tokenizer, request)
        except InvalidRequest as exc:
            await abort_invalid(context, exc, request.WhichOneof("input"))
        return pb.TokenizeResponse(token_ids=ids, tokens=self.engine.tokenizer.convert_ids_to_tokens(ids),
                                   max_context_length=self.engine.max_model_len)

    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:
        await self._check_model(request.model, context)
        bad = [t for t in request.token_ids if t >= self.engine.vocab_size]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"token ids {bad[:5]} are outside the vocabulary (size {self.engine.vocab_size})")
        return pb.DetokenizeResponse(text=self.engine.tokenizer.decode(list(request.token_ids)))


class BackgroundServer:
    """The gRPC server on its own asyncio loop and thread, so the engine loop can own the main
    thread. start() returns once it listens and reports SERVING (or raises why it cannot)."""

    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self.engine = engine
        self.address = f"{host}:{port}"
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() when it happens before ready
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = grpc.aio.server(options=[
            *MESSAGE_SIZE_OPTIONS,
            ("grpc.so_reuseport", 0),  # a port already taken is an error, not a shared listener
        ])
        pb_grpc.add_EngineServicer_to_server(EngineServicer(self.engine), server)
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(
            (ENGINE_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        if server.add_insecure_port(self.address) == 0:
            raise RuntimeError(f"cannot listen on {self.address}")
        await server.start()
        for name in ("", ENGINE_SERVICE):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("engine serving %s on %s", self.engine.loaded.model_id, self.address)
        self._ready.set()
        await self._stop.wait()
        for name in ("", ENGINE_SERVICE):
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.stop(grace=2)
