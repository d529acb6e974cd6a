"""The gRPC face of the engine: the conduit.v1.Engine servicer (background.py serves it, with
health and reflection).

Generate names each call for the logs by its `x-request-id` metadata, else its request_id, else
an id of its own; every line logged while serving the call carries it (clients/logs.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc
from conduit.v1.contract import ERROR_CODE_METADATA_KEY, PARAM_METADATA_KEY, REQUEST_ID_METADATA_KEY
from conduit_common.logs import REQUEST_ID, clean_request_id
from engine_service.text import prompts, truncation
from engine_service.serving.convert import EventEncoder, request_params
from engine_service.serving.many import ManyCalls
from engine_service.core.adapter_dirs import AdapterNotFound, PathNotAllowed
from engine_service.core.adapters import Adapter, RuntimeUpdatingOff
from engine_service.core.engine import Engine
from engine_service.model.lora import AdapterError
from engine_service.core.requests import RequestOutput, deliver
from engine_service.core.params import Draining, InvalidRequest, QueueFull
from engine_service.core.events import FinalEvent, FinishReason
from engine_service.core.sequence import Request
from engine_service.text.reasoning import starting_phase
from engine_service.text.tools import ToolSpec
from engine_service.text.tool_parser import CALL_TAGS

log = logging.getLogger(__name__)

# Threads for a request's CPU work before the engine takes it (chat template, tokenization, grammar
# compilation; detokenizing for Detokenize). Bounded: beyond it such work queues.
CPU_WORKERS = min(4, os.cpu_count() or 1)
T = TypeVar("T")
DRAINING_MESSAGE = "the engine is draining (shutting down) and takes no new requests; retry on another replica"


def caller_request_id(context: grpc.aio.ServicerContext) -> str:
    """The call's x-request-id metadata (cleaned: conduit_common.logs), or ""."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_METADATA_KEY and isinstance(value, str):
            return clean_request_id(value)
    return ""


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


def adapter_status(exc: AdapterError) -> grpc.StatusCode:
    """LoadAdapter's and UnloadAdapter's refusals (engine.proto)."""
    for kind, code in ((RuntimeUpdatingOff, grpc.StatusCode.FAILED_PRECONDITION),
                       (PathNotAllowed, grpc.StatusCode.PERMISSION_DENIED),
                       (AdapterNotFound, grpc.StatusCode.NOT_FOUND)):
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INVALID_ARGUMENT


def outputs_to(loop: asyncio.AbstractEventLoop) -> Callable[[list[RequestOutput]], None]:
    """The engine's consumer of outputs for a server on `loop`: each step's outputs cross to it in
    one hop, where the calls' sinks (queues) take them in turn: every call's messages of a step are
    ready before anything that waits on them runs, so a GenerateMany stream sends them as one
    response (many.py)."""
    return functools.partial(loop.call_soon_threadsafe, deliver)


class EngineServicer(pb_grpc.EngineServicer):
    """Serves an engine built with outputs_to(the server's loop): its calls' sinks are queues of
    that loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.loaded = engine.loaded
        self.created = int(time.time())
        self.draining = False
        self._cpu = ThreadPoolExecutor(CPU_WORKERS, thread_name_prefix="engine-cpu")

    async def _off_loop(self, work: Callable[..., T], *args) -> T:
        """`work(*args)` on the CPU threads: this loop delivers every stream's tokens, so a long
        prompt's template and tokenization (seconds for a large one) must not run on it. The Rust
        tokenizer releases the GIL; a Jinja render does not, but a thread still yields the loop its
        turns. The call's context goes along (the request id its log lines carry). Cancelling the
        call stops waiting; the work finishes and is dropped."""
        run = functools.partial(contextvars.copy_context().run, work, *args)
        return await asyncio.get_running_loop().run_in_executor(self._cpu, run)

    def begin_drain(self, deadline: float) -> None:
        """New Generate calls get UNAVAILABLE; the engine finishes the rest by `deadline`."""
        self.draining = True
        self.engine.drain(deadline)

    async def _check_model(self, model: str, context: grpc.aio.ServicerContext) -> None:
        """NOT_FOUND unless `model` is empty, the served model, or one of its LoRA adapters."""
        adapters = self.engine.adapters
        if model and model != self.loaded.model_id and (adapters is None or adapters.get(model) is None):
            served = [self.loaded.model_id, *(a.name for a in adapters.all())] if adapters else [self.loaded.model_id]
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"model {model!r} is not served here; this engine serves {', '.join(map(repr, served))}")

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        # Responses echo request.request_id; logs use the caller's x-request-id when it sent one. Both
        # are cleaned alike: a megabyte id would be copied into every message, a newline forge log lines.
        metadata_id = caller_request_id(context)
        given_id = clean_request_id(request.request_id)
        own_id = "" if given_id or metadata_id else f"gen-{uuid.uuid4().hex}"
        request_id = given_id or metadata_id or own_id
        log_id = metadata_id or request_id
        REQUEST_ID.set(log_id)  # this call's task only: every line logged below names it
        if self.draining:
            log.info("refused: draining")
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        await self._check_model(request.model, context)
        queue: asyncio.Queue[list] = asyncio.Queue()
        try:
            job = await self._submit(request, request_id, log_id, sink=queue.put_nowait)
        except InvalidRequest as exc:
            log.info("invalid: %s", exc)
            await abort_invalid(context, exc, request.WhichOneof("input"))
            return
        except QueueFull as exc:
            log.warning("refused: %s", exc)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        except Draining:
            log.info("refused: draining")
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
            return
        except AdapterNotFound as exc:  # unloaded between the model check and the queue
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            return
        asked = job.params.stopping.max_tokens
        capped = f" (capped from {asked}: what the context leaves)" if (asked or 0) > job.max_tokens else ""
        log.info("generate: %d prompt tokens, n=%d, max_tokens=%d%s%s%s", len(job.prompt_ids), job.params.n,
                 job.max_tokens, capped, f", LoRA adapter {job.adapter.name}" if job.adapter else "",
                 f" (request_id {request_id})" if request_id != log_id else "")
        encoder = EventEncoder(request_id, self.engine.token_table, echo=job.params.echo,
                               decode=self.engine.tokenizer.decode)
        remaining = job.params.n
        finals: list[FinalEvent] = []
        try:
            while remaining:
                for event in await queue.get():
                    if isinstance(event, FinalEvent):
                        if event.finish_reason.abnormal:
                            await self._abort_abnormal(context, event.finish_reason, log_id)
                            return
                        remaining -= 1
                        finals.append(event)
                    message = encoder.encode(event)
                    if message is not None:
                        yield message
            log.info("finished: %s, %d completion tokens, %.3fs",
                     "/".join(f.finish_reason.value for f in sorted(finals, key=lambda f: f.index)),
                     sum(f.completion_tokens for f in finals), time.monotonic() - job.arrival)
        finally:
            # Client gone, deadline passed or stream done: the engine frees the slot next step.
            if not job.finished:
                log.info("cancelled by the caller after %.3fs", time.monotonic() - job.arrival)
                self.engine.abort(job.request_id)

    async def GenerateMany(self, requests, context: grpc.aio.ServicerContext):
        async for response in ManyCalls(self.Generate, context, lambda: self.draining).responses(requests):
            yield response

    @staticmethod
    async def _abort_abnormal(context: grpc.aio.ServicerContext, reason: FinishReason, log_id: str) -> None:
        if reason is FinishReason.ERROR:
            log.error("failed in the engine: INTERNAL")
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"the engine failed while generating request {log_id}; its log has the details "
                                "under that id")
        if reason is FinishReason.SHUTDOWN:
            log.warning("cut by shutdown: UNAVAILABLE")
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"the engine shut down before request {log_id} finished (drain deadline passed); "
                                "retry on another replica")
        await context.abort(grpc.StatusCode.CANCELLED, f"request {log_id} was cancelled")

    async def _submit(self, request: pb.GenerateRequest, request_id: str, log_id: str, sink) -> Request:
        """The engine's request for a GenerateRequest, queued. Raises InvalidRequest, QueueFull or Draining."""
        params = request_params(request)
        ids, tools, grammar, answer = await self._off_loop(self._prepare, request, params.stopping.max_tokens)
        adapter = self.adapter_of(request.model)
        job = Request(request_id=f"{request_id}/{uuid.uuid4().hex[:8]}", prompt_ids=ids, params=params,
                      max_tokens=0, sink=sink, grammar=grammar, answer_grammar=answer, tools=tools, log_id=log_id,
                      adapter=adapter, batch=request.priority == pb.PRIORITY_BATCH)
        self._reasoning(job, request)
        self.engine.submit(job)
        return job

    def adapter_of(self, model: str) -> Adapter | None:
        """The LoRA adapter a request's `model` names (None: the base model). AdapterNotFound where it was
        unloaded since _check_model: never the base model's answer under an adapter's name."""
        if self.engine.adapters is None or not model or model == self.loaded.model_id:
            return None
        adapter = self.engine.adapters.get(model)
        if adapter is None:
            raise AdapterNotFound(f"model {model!r} is not served here: its LoRA adapter was unloaded")
        return adapter

    def _reasoning(self, job: Request, request: pb.GenerateRequest) -> None:
        """A reasoning model's chat: where its output starts (read from the prompt's end: the
        template may have opened or closed the thinking) and its thinking budget. Other inputs
        (text, token ids) and other models get their output as it comes."""
        tokens = self.engine.reasoning
        if tokens is None or request.WhichOneof("input") != "chat":
            return
        job.reasoning = tokens
        job.reasoning_phase = starting_phase(tokens.fmt, self.engine.tokenizer.decode(job.prompt_ids[-16:]))
        if request.HasField("max_reasoning_tokens"):
            job.max_reasoning_tokens = request.max_reasoning_tokens

    def _prepare(self, request: pb.GenerateRequest,
                 max_tokens: int | None) -> tuple[list[int], ToolSpec | None, str | None, str | None]:
        """The prompt's token ids, the chat's tools, and the grammars (validated: ~100 ms for some)."""
        ids = self._prompt_ids(request, max_tokens)
        tools = ToolSpec.from_chat(request.chat) if request.WhichOneof("input") == "chat" else None
        grammar = answer = None
        if request.HasField("constraint") or (tools is not None and tools.forced):
            grammar, answer = self._grammar(request, tools)
        return ids, tools, grammar, answer

    def _prompt_ids(self, request: pb.GenerateRequest, max_tokens: int | None) -> list[int]:
        if not request.drop_oldest_messages:
            return prompts.prompt_ids(self.engine.tokenizer, request)
        if request.WhichOneof("input") != "chat":
            raise InvalidRequest("drop_oldest_messages needs chat input", "drop_oldest_messages")
        budget = self.engine.admission.context_limit - (1 if max_tokens is None else max_tokens)
        if budget < 1:  # max_tokens alone fills the context: admission says so, naming it
            return prompts.prompt_ids(self.engine.tokenizer, request)
        ids, dropped = truncation.fit_chat(self.engine.tokenizer, request, budget)
        if dropped:
            log.info("dropped the %d oldest messages to fit the context (%d prompt tokens left)", dropped, len(ids))
        return ids

    def _grammar(self, request: pb.GenerateRequest, tools: ToolSpec | None) -> tuple[str | None, str | None]:
        """The grammar this turn's output follows, validated (may take ~100 ms): the constraint, the
        forced tool calls, or on auto either calls or an answer under the constraint; and in that
        last case the answer's grammar alone. A forced call leaves the constraint to a later turn's
        answer, but a bad one is refused now all the same."""
        grammars = self.engine.grammars
        answer = grammars.grammar_for(request.constraint)
        if answer is not None:
            grammars.validate(answer)
        if tools is None:
            return answer, None
        grammar = tools.grammar(answer, bare_calls=prompts.template_knows_tools(self.engine.tokenizer),
                                tag_tokens=grammars.special_tokens(CALL_TAGS))
        problem = None if grammar is None else grammars.problem(grammar)
        if problem is not None:
            # The constraint compiled alone, so a tool's parameters are at fault: name that tool.
            raise tools.schema_error(grammars.schema_problem) or InvalidRequest(
                f"the tools cannot be enforced: {problem}", "chat.tools")
        return grammar, (answer if grammar is not None and not tools.forced else None)

    def _model_info(self, model: str = "") -> pb.ModelInfo:
        """The served model's facts; a LoRA adapter's (`model`) are its base's, with its name, folder and parent."""
        info = pb.ModelInfo(
            id=self.loaded.model_id, source=self.loaded.source, max_context_length=self.engine.max_model_len,
            vocab_size=self.engine.vocab_size, dtype=str(self.loaded.dtype).removeprefix("torch."),
            device=str(self.loaded.device), created=self.created, eos_token_ids=self.loaded.eos_token_ids)
        adapter = self.engine.adapters.get(model) if self.engine.adapters and model else None
        if adapter is not None:
            info.id, info.source, info.parent = adapter.name, adapter.path, self.loaded.model_id
        return info

    async def GetLoad(self, request: pb.GetLoadRequest, context) -> pb.LoadReport:
        load, config = self.engine.load, self.engine.config
        return pb.LoadReport(running_requests=load.running, waiting_requests=load.waiting,
                             kv_cache_usage=load.kv_usage, block_size=config.block_size,
                             num_blocks=self.engine.scheduler.blocks.num_blocks,
                             prefix_caching=config.enable_prefix_caching, draining=self.draining,
                             model=self.loaded.model_id, resident_adapters=[
                                 adapter.name for adapter in (self.engine.adapters.all() if self.engine.adapters
                                                              else []) if adapter.slot])

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        adapters = self.engine.adapters.all() if self.engine.adapters else []
        return pb.ListModelsResponse(models=[self._model_info(), *(self._model_info(a.name) for a in adapters)])

    async def LoadAdapter(self, request: pb.LoadAdapterRequest, context) -> pb.ModelInfo:
        REQUEST_ID.set(caller_request_id(context) or None)
        await self._check_lora(context)
        try:  # reads the adapter's files and moves its weights: off the loop
            adapter = await self._off_loop(self.engine.load_adapter, request.name, request.path)
        except AdapterError as exc:
            log.info("LoRA adapter %r from %r refused: %s", request.name, request.path, exc)
            await context.abort(adapter_status(exc), str(exc))
        return self._model_info(adapter.name)

    async def UnloadAdapter(self, request: pb.UnloadAdapterRequest, context) -> pb.UnloadAdapterResponse:
        REQUEST_ID.set(caller_request_id(context) or None)
        await self._check_lora(context)
        try:
            self.engine.unload_adapter(request.name)
        except AdapterError as exc:
            await context.abort(adapter_status(exc), str(exc))
        return pb.UnloadAdapterResponse()

    async def _check_lora(self, context: grpc.aio.ServicerContext) -> None:
        if self.engine.adapters is None:  # also an embedding model's engine
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this engine serves no LoRA adapters for {self.loaded.model_id!r}: start it with "
                                "--enable-lora (and --allow-runtime-lora-updating --lora-dirs DIR to load them at run "
                                "time)")

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        await self._check_model(request.model, context)
        return self._model_info(request.model)

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        await self._check_model(request.model, context)
        REQUEST_ID.set(caller_request_id(context) or None)
        try:
            ids, tokens = await self._off_loop(self._tokenize, request)
        except InvalidRequest as exc:
            await abort_invalid(context, exc, request.WhichOneof("input"))
        log.info("tokenize: %d tokens", len(ids))
        return pb.TokenizeResponse(token_ids=ids, tokens=tokens, max_context_length=self.engine.max_model_len)

    def _tokenize(self, request: pb.TokenizeRequest) -> tuple[list[int], list[str]]:
        ids = prompts.prompt_ids(self.engine.tokenizer, request)
        return ids, self.engine.tokenizer.convert_ids_to_tokens(ids)

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        """A generation model serves no embeddings unless started with --enable-embeddings
        (serving/decoder_embed.py); serving/embed.py serves an embedding model's."""
        await self._check_model(request.model, context)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"model {self.loaded.model_id!r} is a generation model and serves no embeddings; "
                            "use an embedding model (e.g. conduit-engine --model all-MiniLM-L6-v2), or start "
                            "this engine with --enable-embeddings if the model was trained to embed")

    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:
        await self._check_model(request.model, context)
        bad = [t for t in request.token_ids if t >= self.engine.vocab_size]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"token ids {bad[:5]} are outside the vocabulary (size {self.engine.vocab_size})")
        text = await self._off_loop(self.engine.tokenizer.decode, list(request.token_ids))
        return pb.DetokenizeResponse(text=text)
