"""The Embed RPC: the servicer of an engine that serves an embedding model, and the checks of an
EmbedRequest's inputs against that model.

An embedding model's engine serves embeddings only: Generate and GenerateMany here end with
FAILED_PRECONDITION. Embed on a generation model does too (server.py) unless the engine was started
with --enable-embeddings (serving/decoder_embed.py, which shares this module's checks and packing): a
chat model's hidden states are no embedding it was trained for, and vectors that look right but
retrieve badly are worse than a clear refusal, so that is the operator's explicit choice (a decoder
trained for embeddings, Qwen3-Embedding style, beside its own generation).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import grpc
import torch

from conduit_common.logs import REQUEST_ID, clean_request_id
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import MAX_EMBED_INPUTS
from engine_service.core.embedding_engine import EmbeddingEngine, EmbedJob
from engine_service.core.events import FinishReason
from engine_service.core.params import Draining, InvalidRequest, QueueFull
from engine_service.model.encoder import EmbeddingModel
from engine_service.serving.server import DRAINING_MESSAGE, EngineServicer, abort_invalid, caller_request_id

log = logging.getLogger(__name__)

FOREIGN_IDS_HINT = ("token ids must be this model's own, as Tokenize returns them (beginning with {prefix} and "
                    "ending with {suffix}); ids from another tokenizer (LangChain's OpenAIEmbeddings sends "
                    "tiktoken's unless given check_embedding_ctx_length=False) would embed as nonsense")


def embed_inputs(model: EmbeddingModel, request: pb.EmbedRequest, max_len: int) -> list[list[int]]:
    """Each input's token ids, checked and (when asked) truncated. Raises InvalidRequest naming
    the field at fault ("inputs[3]", "dimensions", ...)."""
    if not request.inputs:
        raise InvalidRequest("inputs must not be empty", "inputs")
    if len(request.inputs) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request, not {len(request.inputs)}", "inputs")
    if request.HasField("dimensions") and not model.allows_dimensions(request.dimensions):
        shorter = ("this model was not trained for shorter vectors" if model.matryoshka_dimensions is None
                   else f"allowed: {list(model.matryoshka_dimensions) or f'1 to {model.dimensions}'}")
        raise InvalidRequest(f"dimensions={request.dimensions} is not supported by {model.model_id}, whose vectors "
                             f"have {model.dimensions} dimensions ({shorter})", "dimensions")
    truncate_to = None
    if request.HasField("truncate_prompt_tokens"):
        truncate_to = request.truncate_prompt_tokens or max_len
        edges = len(model.special_prefix) + len(model.special_suffix)
        if not edges < truncate_to <= max_len:
            raise InvalidRequest(f"truncate_prompt_tokens must be from {edges + 1} to this model's maximum context "
                                 f"length {max_len}, or 0 for that length; not {truncate_to}",
                                 "truncate_prompt_tokens")
    texts = {}  # input index -> text, tokenized together below (one call of the Rust tokenizer)
    given: dict[int, list[int]] = {}
    for i, item in enumerate(request.inputs):
        param, kind = f"inputs[{i}]", item.WhichOneof("input")
        if kind == "text":
            if not item.text:
                raise InvalidRequest(f"{param} is an empty string", param)
            texts[i] = item.text
        elif kind == "token_ids":
            given[i] = _own_ids(model, list(item.token_ids.ids), param, truncate_to)
        else:
            raise InvalidRequest(f"{param} has neither text nor token_ids", param)
    given.update(zip(texts, model.tokenize_many(list(texts.values()), truncate_to)))
    return [_within_context(given[i], f"inputs[{i}]", max_len) for i in range(len(request.inputs))]


# Inputs small enough to check and tokenize on the event loop: a query's take ~0.03 ms, less than the
# hop to a worker thread and back (~0.07 ms of CPU, and a thread to schedule on a busy machine).
INLINE_INPUT_SIZE = 2048  # characters of text plus token ids (and one per input), over the request


def inline_work(request: pb.EmbedRequest) -> bool:
    size = 0
    for item in request.inputs:
        size += 1 + len(item.text) + len(item.token_ids.ids)
        if size > INLINE_INPUT_SIZE:
            return False
    return True


def _own_ids(model: EmbeddingModel, ids: list[int], param: str, truncate_to: int | None) -> list[int]:
    _check_own_ids(model, ids, param)
    if truncate_to is not None and len(ids) > truncate_to:
        cut = truncate_to - len(model.special_suffix)
        ids = ids[:cut] + list(model.special_suffix)
    return ids


def _within_context(ids: list[int], param: str, max_len: int) -> list[int]:
    if len(ids) > max_len:
        raise InvalidRequest(
            f"This model's maximum context length is {max_len} tokens, however you requested {len(ids)} tokens "
            f"({len(ids)} in {param}). Please reduce the input, or set truncate_prompt_tokens.",
            param, "context_length_exceeded")
    return ids


def _check_own_ids(model: EmbeddingModel, ids: list[int], param: str) -> None:
    prefix, suffix = list(model.special_prefix), list(model.special_suffix)
    if not ids:
        raise InvalidRequest(f"{param} has no token ids", param)
    if any(t >= model.vocab_size for t in ids):
        raise InvalidRequest(f"{param}: token ids must be below this model's vocabulary size {model.vocab_size}; "
                             + FOREIGN_IDS_HINT.format(prefix=prefix, suffix=suffix), param)
    if len(ids) < len(prefix) + len(suffix) or ids[:len(prefix)] != prefix or ids[len(ids) - len(suffix):] != suffix:
        raise InvalidRequest(f"{param}: " + FOREIGN_IDS_HINT.format(prefix=prefix, suffix=suffix), param)


def shorten(vectors: torch.Tensor, dimensions: int, normalize: bool) -> torch.Tensor:
    """Matryoshka: the first `dimensions` values, normalized again where the model normalizes."""
    if dimensions >= vectors.shape[1]:
        return vectors
    short = vectors[:, :dimensions]
    return torch.nn.functional.normalize(short, p=2, dim=-1) if normalize else short


def call_ids(request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """(the call's request id, the id its log lines carry), as Generate names its calls; sets the latter."""
    metadata_id = caller_request_id(context)
    request_id = clean_request_id(request.request_id) or metadata_id or f"emb-{uuid.uuid4().hex}"
    REQUEST_ID.set(metadata_id or request_id)
    return request_id, metadata_id or request_id


async def checked_inputs(servicer: EngineServicer, model: EmbeddingModel, request: pb.EmbedRequest,
                         context: grpc.aio.ServicerContext, max_len: int) -> list[list[int]]:
    """What every Embed does first: UNAVAILABLE while draining, NOT_FOUND for another model, then each
    input's ids (embed_inputs), or INVALID_ARGUMENT naming the field at fault."""
    if servicer.draining:
        await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
    await servicer._check_model(request.model, context)
    try:  # 2048 texts take a while to tokenize: off the event loop, but not a query (see inline_work)
        if inline_work(request):
            return embed_inputs(model, request, max_len)
        return await servicer._off_loop(embed_inputs, model, request, max_len)
    except InvalidRequest as exc:
        log.info("invalid: %s", exc)
        await abort_invalid(context, exc, None)
        raise  # not reached: abort raises


def embed_response(model: EmbeddingModel, request: pb.EmbedRequest, vectors: torch.Tensor,
                   inputs: list[list[int]]) -> pb.EmbedResponse:
    """The vectors (one row per input, in order), shortened where `dimensions` asks, packed."""
    dimensions = request.dimensions if request.HasField("dimensions") else model.dimensions
    vectors = shorten(vectors, dimensions, model.pooling.normalize)
    return pb.EmbedResponse(
        embeddings=[pb.Embedding(values=row.tolist(), prompt_tokens=len(ids)) for row, ids in zip(vectors, inputs)],
        prompt_tokens=sum(len(ids) for ids in inputs), model=model.model_id)


class EmbeddingServicer(EngineServicer):
    """conduit.v1.Engine over an EmbeddingEngine: Embed, plus what every engine answers (models,
    Tokenize, Detokenize, GetLoad, health through BackgroundServer)."""

    engine: EmbeddingEngine  # type: ignore[assignment]

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        request_id, log_id = call_ids(request, context)
        model: EmbeddingModel = self.engine.loaded
        inputs = await checked_inputs(self, model, request, context, self.engine.max_model_len)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[torch.Tensor | None, FinishReason]] = loop.create_future()

        def sink(vectors: torch.Tensor | None, reason: FinishReason) -> None:  # on the engine's thread
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result((vectors, reason)))

        job = EmbedJob(request_id=f"{request_id}/{uuid.uuid4().hex[:8]}", inputs=inputs, sink=sink, log_id=log_id,
                       batch=request.priority == pb.PRIORITY_BATCH)
        try:
            self.engine.submit(job)
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
        try:
            vectors, reason = await done
        finally:
            if not done.done():  # the caller left or its deadline passed: the engine drops the rest
                log.info("cancelled by the caller after %.3fs", time.monotonic() - job.arrival)
                self.engine.abort(job.request_id)
        if vectors is None:
            await self._abort_abnormal(context, reason, job.log_id)
        log.info("embedded %d input(s), %d tokens, %.3fs", len(inputs), job.prompt_tokens,
                 time.monotonic() - job.arrival)
        return embed_response(model, request, vectors, inputs)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        await self._check_model(request.model, context)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"model {self.loaded.model_id!r} is an embedding model: it serves Embed "
                            "(/v1/embeddings), not generation")
        yield  # an async generator, as the stream's handler must be

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        """A text's ids exactly as Embed sees them (special tokens included)."""
        await self._check_model(request.model, context)
        if request.WhichOneof("input") != "text":
            await abort_invalid(context, InvalidRequest("an embedding model tokenizes text, not chat messages",
                                                        "chat"), None)
        ids = await self._off_loop(self.engine.loaded.tokenize, request.text)
        return pb.TokenizeResponse(token_ids=ids, tokens=self.engine.tokenizer.convert_ids_to_tokens(ids),
                                   max_context_length=self.engine.max_model_len)

    async def GetLoad(self, request: pb.GetLoadRequest, context) -> pb.LoadReport:
        load = self.engine.load
        return pb.LoadReport(running_requests=load.running, waiting_requests=load.waiting, kv_cache_usage=0.0,
                             block_size=0, num_blocks=0, prefix_caching=False, draining=self.draining,
                             model=self.loaded.model_id)
