"""Embed on a generation engine started with --enable-embeddings: the servicer of such an engine.

Each input becomes a prefill-only sequence of one engine Request (Request.inputs): admitted, limited,
cancelled, drained and counted like generation, batched in the same steps as the chat traffic within
the step-token budget (chunked like any prompt); its vector is the final norm's hidden state at its
last token, normalized (core/choices.py), and its blocks are freed at once. The inputs are checked and
the answer packed as an embedding model's engine does (serving/embed.py), against the view of the
model that `embedding_view` gives. A LoRA adapter's name as `model` embeds with the adapter, as it generates.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import grpc
import torch

from conduit.v1 import engine_pb2 as pb
from engine_service.core.adapter_dirs import AdapterNotFound
from engine_service.core.engine import Engine
from engine_service.core.events import FinalEvent
from engine_service.core.params import (Draining, InvalidRequest, QueueFull, RequestParams, SamplingParams,
                                        StoppingParams)
from engine_service.core.sequence import Request
from engine_service.model.encoder import EmbeddingModel, Pooling, special_tokens_around
from engine_service.serving.embed import call_ids, checked_inputs, embed_response
from engine_service.serving.server import DRAINING_MESSAGE, EngineServicer, abort_invalid

log = logging.getLogger(__name__)


def embedding_view(engine: Engine) -> EmbeddingModel:
    """The generation model as serving/embed.py's checks see an embedding model: last-token pooling,
    normalized, vectors of the hidden size, inputs up to what one sequence may hold."""
    loaded = engine.loaded
    prefix, suffix = special_tokens_around(loaded.tokenizer)
    return EmbeddingModel(
        model_id=loaded.model_id, source=loaded.source, model=loaded.model, tokenizer=loaded.tokenizer,
        device=loaded.device, dtype=loaded.dtype, max_context_length=engine.admission.context_limit,
        dimensions=int(loaded.model.config.hidden_size), pooling=Pooling("lasttoken", True),
        matryoshka_dimensions=None, special_prefix=prefix, special_suffix=suffix)


class DecoderEmbedServicer(EngineServicer):
    """EngineServicer (generation) plus Embed."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.embedding = embedding_view(engine)

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        request_id, log_id = call_ids(request, context)
        inputs = await checked_inputs(self, self.embedding, request, context, self.embedding.max_context_length)
        queue: asyncio.Queue[list] = asyncio.Queue()
        try:
            job = Request(request_id=f"{request_id}/{uuid.uuid4().hex[:8]}", prompt_ids=inputs[0],
                          params=RequestParams(SamplingParams(), StoppingParams(), n=len(inputs)), max_tokens=0,
                          sink=queue.put_nowait, inputs=inputs, log_id=log_id, adapter=self.adapter_of(request.model),
                          batch=request.priority == pb.PRIORITY_BATCH)
            self.engine.submit(job)
        except AdapterNotFound as exc:  # unloaded between the model check and here
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except InvalidRequest as exc:  # checked above already; the engine's own check, to be sure
            await abort_invalid(context, exc, None)
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        vectors: dict[int, torch.Tensor] = {}  # by input; a step that failed and was retried may send one again
        try:
            while len(vectors) < len(inputs):
                for event in await queue.get():
                    if isinstance(event, FinalEvent):
                        if event.finish_reason.abnormal:
                            await self._abort_abnormal(context, event.finish_reason, log_id)
                        vectors[event.index] = event.embedding
        finally:
            if len(vectors) < len(inputs):  # the caller left, its deadline passed, or the engine ended it
                log.info("embedding cancelled or ended after %.3fs", time.monotonic() - job.arrival)
                self.engine.abort(job.request_id)
        log.info("embedded %d input(s), %d tokens, %.3fs", len(inputs), sum(map(len, inputs)),
                 time.monotonic() - job.arrival)
        response = embed_response(self.embedding, request, torch.stack([vectors[i] for i in range(len(inputs))]),
                                  inputs)
        if job.adapter is not None:
            response.model = job.adapter.name
        return response
