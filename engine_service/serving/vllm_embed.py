"""vllm.grpc.engine.VllmEngine on an embedding model's engine: `Embed` for the Shepherd gateway's
embedding workers, beside conduit.v1's Embed (serving/embed.py) on the same port.

The gateway tokenizes with the tokenizer GetTokenizer gives it and sends one input's token ids per
call; they are checked and embedded exactly as conduit.v1's Embed embeds an input given as token ids
(the model's own ids, special tokens included, within its context), through the same servicer, so
the vector is the one /v1/embeddings returns for that text. Generation is refused
(FAILED_PRECONDITION, as conduit.v1's Generate on this engine), and there is no prefix cache to
publish or flush.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2 as vpb

from engine_service.serving.embed import EmbeddingServicer
from engine_service.serving.tokenizer_zip import TokenizerZip
from engine_service.serving.vllm_worker import SERVER_TYPE, VllmWorker, embed_through


class VllmEmbedWorker(VllmWorker):
    def __init__(self, conduit: EmbeddingServicer) -> None:  # not super's: that one needs a generation engine
        self.conduit = conduit
        self.engine = conduit.engine
        self.started = time.time()
        self.tokenizer_zip = TokenizerZip(self.engine.tokenizer, self.engine.loaded.model.config)
        self._calls: dict[str, str] = {}  # Abort finds nothing to end: an Embed call ends with its caller

    async def Embed(self, request: vpb.EmbedRequest, context: grpc.aio.ServicerContext) -> vpb.EmbedResponse:
        return await embed_through(self.conduit, request, context)

    async def Generate(self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"model {self.engine.loaded.model_id!r} is an embedding model: it serves Embed, "
                            "not generation")
        yield  # an async generator, as the stream's handler must be

    async def GetModelInfo(self, request, context) -> vpb.GetModelInfoResponse:
        loaded = self.engine.loaded
        config = loaded.model.config
        tokenizer = self.engine.tokenizer
        return vpb.GetModelInfoResponse(
            model_path=loaded.source, is_generation=False, max_context_length=self.engine.max_model_len,
            vocab_size=self.engine.vocab_size, served_model_name=loaded.model_id, tokenizer_path=loaded.source,
            model_type=getattr(config, "model_type", "") or "",
            architectures=getattr(config, "architectures", None) or [], eos_token_ids=loaded.eos_token_ids,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else -1,
            bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else -1,
            max_req_input_len=self.engine.max_model_len)

    async def GetServerInfo(self, request, context) -> vpb.GetServerInfoResponse:
        load = self.engine.load
        return vpb.GetServerInfoResponse(
            active_requests=load.running + load.waiting, is_paused=self.conduit.draining,
            uptime_seconds=time.time() - self.started, server_type=SERVER_TYPE, data_parallel_size=1,
            model_dtype=str(self.engine.loaded.dtype), max_num_seqs=self.engine.max_rows)

    async def GetLoads(self, request: vpb.GetLoadsRequest, context) -> vpb.GetLoadsResponse:
        load = self.engine.load
        return vpb.GetLoadsResponse(
            timestamp=datetime.now(timezone.utc).isoformat(), version="conduit", dp_rank_count=1,
            loads=[vpb.SchedulerLoad(dp_rank=0, num_running_reqs=load.running, num_waiting_reqs=load.waiting,
                                     num_total_reqs=load.running + load.waiting,
                                     max_running_requests=self.engine.max_rows)])

    async def FlushCache(self, request: common_pb2.FlushCacheRequest, context) -> common_pb2.FlushCacheResponse:
        return common_pb2.FlushCacheResponse(success=True, message="an embedding engine caches nothing")

    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "an embedding engine has no prefix cache to publish")
        yield  # an async generator, as the stream's handler must be
