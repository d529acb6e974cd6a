"""vllm.grpc.engine.VllmEngine on the engine's gRPC port, beside conduit.v1.Engine: the protocol the
Shepherd Model Gateway (`smg`) speaks to its gRPC workers, from the smg-grpc-proto package.

The gateway tokenizes and applies chat templates, parses tool calls and reasoning, and detokenizes
itself: a Generate takes token ids and returns token ids. Each call submits to the engine exactly
as conduit.v1's Generate does (server.py): one Request whose sink is this call's queue, the step's
outputs arriving on the server's loop in one hop; no thread or task of its own. Unused, the service
costs nothing but its registration (the KV-event listener is attached by the first subscriber).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime, timezone

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2 as vpb, vllm_engine_pb2_grpc as vpb_grpc

from conduit_common.logs import REQUEST_ID, clean_request_id
from conduit.v1 import engine_pb2 as pb
from engine_service.core.engine import Engine
from engine_service.core.events import FinalEvent, FinishReason
from engine_service.core.params import Draining, InvalidRequest, QueueFull
from engine_service.core.sequence import Request
from engine_service.serving.kv_events import KvEventPublisher
from engine_service.serving.server import DRAINING_MESSAGE, EngineServicer
from engine_service.serving.tokenizer_zip import TokenizerZip
from engine_service.serving.vllm_outputs import VllmEncoder
from engine_service.serving.vllm_params import Unsupported, check_supported, constraint, proto_field, request_params
from engine_service.text import prompts

log = logging.getLogger(__name__)

SERVICE_NAME = vpb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
SERVER_TYPE = "conduit-grpc"
FLUSH_POLL_S = 0.05


class VllmWorker(vpb_grpc.VllmEngineServicer):
    def __init__(self, conduit: EngineServicer) -> None:
        self.conduit = conduit  # its drain state; served on its loop, where the engine's outputs arrive
        self.engine: Engine = conduit.engine
        self.started = time.time()
        self.kv_events = KvEventPublisher(self.engine.scheduler.blocks)
        model = self.engine.loaded.model
        self.tokenizer_zip = TokenizerZip(self.engine.tokenizer, model.config,
                                          getattr(model, "generation_config", None))
        self._calls: dict[str, str] = {}  # the caller's request_id -> the engine's, for Abort

    def add_to(self, server: grpc.aio.Server) -> str:
        """Register on `server`; returns the service's name (for reflection and health)."""
        vpb_grpc.add_VllmEngineServicer_to_server(self, server)
        return SERVICE_NAME

    # ------------------------------------------------------------------ Generate

    async def Generate(self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext):
        # The gateway's id names the call for Abort; cleaned, it names it in the logs (as server.py's).
        request_id = request.request_id or f"vllm-{uuid.uuid4().hex}"
        log_id = clean_request_id(request_id)
        REQUEST_ID.set(log_id)
        if self.conduit.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        sp = request.sampling_params
        queue: asyncio.Queue[list] = asyncio.Queue()
        try:
            check_supported(request)
            job = Request(request_id=f"{log_id}/{uuid.uuid4().hex[:8]}", prompt_ids=self._prompt_ids(request),
                          params=request_params(sp), max_tokens=0, sink=queue.put_nowait, log_id=log_id)
            wanted = constraint(sp)
            if wanted is not None:  # compiling may take ~100 ms: off the event loop
                job.grammar = await asyncio.to_thread(self._grammar, wanted)
            self.engine.submit(job)
        except Unsupported as exc:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))
        except InvalidRequest as exc:
            field = proto_field(exc.param)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}" if field else str(exc))
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        log.info("generate (vllm protocol): %d prompt tokens, n=%d, max_tokens=%d",
                 len(job.prompt_ids), job.params.n, job.max_tokens)
        self._calls[request_id] = job.request_id
        encoder = VllmEncoder(request.stream, sp.HasField("logprobs"), job.params.top_logprobs,
                              job.params.stopping.stop_token_ids)
        remaining = job.params.n
        try:
            while remaining:
                for event in await queue.get():
                    if isinstance(event, FinalEvent):
                        remaining -= 1
                        if event.finish_reason in (FinishReason.ERROR, FinishReason.SHUTDOWN):
                            await self._abort_abnormal(context, event.finish_reason, log_id)
                    message = encoder.encode(event)
                    if message is not None:
                        yield message
        finally:
            if self._calls.get(request_id) == job.request_id:
                del self._calls[request_id]
            if not job.finished:  # the caller left (cancelled, deadline): the slot is freed next step
                log.info("cancelled by the caller after %.3fs", time.monotonic() - job.arrival)
                self.engine.abort(job.request_id)

    def _prompt_ids(self, request: vpb.GenerateRequest) -> list[int]:
        if request.WhichOneof("input") == "text":
            return prompts.prompt_ids(self.engine.tokenizer, pb.GenerateRequest(text=request.text))
        return list(request.tokenized.input_ids)

    def _grammar(self, wanted: pb.Constraint) -> str:
        grammar = self.engine.grammars.grammar_for(wanted)
        self.engine.grammars.validate(grammar)
        return grammar

    @staticmethod
    async def _abort_abnormal(context: grpc.aio.ServicerContext, reason: FinishReason, request_id: str) -> None:
        if reason is FinishReason.ERROR:
            await context.abort(grpc.StatusCode.INTERNAL, f"the engine failed while generating request "
                                f"{request_id}; its log has the details under that id")
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"the engine shut down before request {request_id} "
                            "finished; retry on another replica")

    async def Abort(self, request: vpb.AbortRequest, context) -> vpb.AbortResponse:
        for request_id in request.request_ids:
            engine_id = self._calls.get(request_id)
            if engine_id is not None:
                log.info("abort of %s requested", clean_request_id(request_id))
                self.engine.abort(engine_id)
        return vpb.AbortResponse()

    async def Embed(self, request: vpb.EmbedRequest, context) -> vpb.EmbedResponse:
        if self.engine.config.enable_embeddings:  # --enable-embeddings: conduit.v1's Embed (decoder_embed.py)
            return await embed_through(self.conduit, request, context)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "this engine serves a generative model: no embeddings (Conduit's shim serves "
                            "/v1/embeddings from its own embedding model; --enable-embeddings serves this one's)")

    # ----------------------------------------------------------------- the rest

    async def HealthCheck(self, request, context) -> vpb.HealthCheckResponse:
        if self.conduit.draining:
            return vpb.HealthCheckResponse(healthy=False, message="draining")
        return vpb.HealthCheckResponse(healthy=True, message="serving")

    async def GetModelInfo(self, request, context) -> vpb.GetModelInfoResponse:
        loaded, config = self.engine.loaded, self.engine.loaded.model.config
        tokenizer = self.engine.tokenizer
        return vpb.GetModelInfoResponse(
            model_path=loaded.source, is_generation=True, max_context_length=self.engine.max_model_len,
            vocab_size=self.engine.vocab_size, served_model_name=loaded.model_id, tokenizer_path=loaded.source,
            model_type=getattr(config, "model_type", "") or "",
            architectures=getattr(config, "architectures", None) or [],
            eos_token_ids=loaded.eos_token_ids,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else -1,
            bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else -1,
            max_req_input_len=self.engine.max_model_len - 1)

    async def GetServerInfo(self, request, context) -> vpb.GetServerInfoResponse:
        load = self.engine.load
        return vpb.GetServerInfoResponse(
            active_requests=load.running + load.waiting, is_paused=self.conduit.draining,
            uptime_seconds=time.time() - self.started, server_type=SERVER_TYPE, data_parallel_size=1,
            block_size=self.engine.config.block_size,
            model_dtype=str(self.engine.loaded.dtype), max_num_seqs=self.engine.config.max_batch_size)

    async def GetLoads(self, request: vpb.GetLoadsRequest, context) -> vpb.GetLoadsResponse:
        """The numbers conduit.v1's GetLoad reports (and the gateway metrics), as of the last step."""
        load, blocks = self.engine.load, self.engine.scheduler.blocks
        capacity = blocks.num_blocks * blocks.block_size
        hit_rate = blocks.hits / blocks.queries if blocks.queries else 0.0
        return vpb.GetLoadsResponse(
            timestamp=datetime.now(timezone.utc).isoformat(), version="conduit", dp_rank_count=1,
            loads=[vpb.SchedulerLoad(
                dp_rank=0, num_running_reqs=load.running, num_waiting_reqs=load.waiting,
                num_total_reqs=load.running + load.waiting, num_used_tokens=round(load.kv_usage * capacity),
                max_total_num_tokens=capacity, token_usage=load.kv_usage, cache_hit_rate=hit_rate,
                max_running_requests=self.engine.config.max_batch_size)])

    async def GetTokenizer(self, request, context):
        for chunk in await self.tokenizer_zip.chunks():
            yield chunk

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context) -> common_pb2.FlushCacheResponse:
        """Waits up to timeout_s for the engine to go idle; the next admission then starts from an
        empty prefix cache (the engine thread forgets it there: block_manager.py)."""
        deadline = time.monotonic() + max(request.timeout_s, 0.0)
        while self.engine.load.running or self.engine.load.waiting:
            if time.monotonic() >= deadline:
                return common_pb2.FlushCacheResponse(success=False, message="requests are in flight")
            await asyncio.sleep(FLUSH_POLL_S)
        self.engine.scheduler.blocks.flush_requested = True
        return common_pb2.FlushCacheResponse(success=True, message="prefix cache flushed: no later request "
                                             "reuses a block cached before this call")

    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest, context):
        log.info("KV events: a subscriber from %s (from sequence %d)", context.peer(), request.start_sequence_number)
        async for batch in self.kv_events.subscribe(request.start_sequence_number):
            yield batch

    async def StartProfile(self, request, context) -> common_pb2.ProfileResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this engine (Conduit) has no profiler to start")

    async def StopProfile(self, request, context) -> common_pb2.ProfileResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this engine (Conduit) has no profiler to stop")


async def embed_through(conduit: EngineServicer, request: vpb.EmbedRequest,
                        context: grpc.aio.ServicerContext) -> vpb.EmbedResponse:
    """The gateway's one-input Embed through conduit.v1's Embed on `conduit`: checked and embedded exactly
    as an input given there (its token ids, or its text tokenized here, as the gateway would have)."""
    if request.tokenized.input_ids:
        item = pb.EmbedInput(token_ids=pb.TokenIds(ids=request.tokenized.input_ids))
    else:
        item = pb.EmbedInput(text=request.tokenized.original_text)
    answer = await conduit.Embed(pb.EmbedRequest(request_id=request.request_id, inputs=[item]), context)
    (embedding,) = answer.embeddings
    return vpb.EmbedResponse(embedding=embedding.values, prompt_tokens=embedding.prompt_tokens,
                             embedding_dim=len(embedding.values))
