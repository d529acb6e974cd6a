"""Concurrent /v1/embeddings requests to one engine share one Embed call (docs/embeddings.md).

A gRPC call per short query cost about as much CPU as its forward. So while MAX_IN_FLIGHT calls to an
engine are out, a request waits (else it goes at once); when one comes back, the requests that asked the
same thing (engine, model, dimensions, truncation) meanwhile go as one call, each taking its own vectors
back. An error the engine pins on an input ("inputs[7]" too long) would name the wrong request's input in
a shared call, so each request of that call then goes alone; any other error is every member's alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gevent
import grpc
from gevent.event import AsyncResult

from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import MAX_EMBED_INPUTS

# Two: while the engine runs one call's step, the next call is already queued there, so the engine
# never idles for the shim's round trip; the requests arriving meanwhile gather behind them. Per
# replica, where a model has several (RoutedEngine.width): each call goes to the least loaded one.
MAX_IN_FLIGHT = 2


@dataclass
class EmbedAnswer:
    """One request's share of an EmbedResponse."""

    embeddings: Sequence[pb.Embedding]
    prompt_tokens: int
    model: str


@dataclass(eq=False)
class _Waiter:
    request: pb.EmbedRequest
    metadata: Any
    result: AsyncResult = field(default_factory=AsyncResult)  # an EmbedAnswer, an exception, or _ALONE


_ALONE = object()  # the shared call failed on some input: go again alone


class EmbedCoalescer:
    """Per engine (a client, or a model's RoutedEngine) and request shape: the requests waiting, and the
    calls out. Greenlets only."""

    def __init__(self) -> None:
        self._waiting: dict[tuple, list[_Waiter]] = {}
        self._in_flight: dict[tuple, int] = {}

    def embed(self, engine: Any, request: pb.EmbedRequest, timeout: float | None, metadata: Any) -> EmbedAnswer:
        """`engine.embed(request=...)`'s answer for this request, maybe from a call shared with others.
        Raises ConduitError as that call would."""
        key = (engine, request.model, request.priority,  # a Batch API line's call shares none of a live one
               request.dimensions if request.HasField("dimensions") else None,
               request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None)
        waiter = _Waiter(request, metadata)
        self._waiting.setdefault(key, []).append(waiter)
        self._send(key, engine, timeout)
        if waiter.result.get() is _ALONE:
            waiter = _Waiter(request, metadata)
            _call(engine, [waiter], timeout)
        return waiter.result.get()

    def _send(self, key: tuple, engine: Any, timeout: float | None) -> None:
        """One call for the requests waiting (in arrival order, up to MAX_EMBED_INPUTS inputs in all);
        then, if more came meanwhile, another call for them on a greenlet of its own."""
        waiting = self._waiting.get(key)
        if not waiting or self._in_flight.get(key, 0) >= MAX_IN_FLIGHT * getattr(engine, "width", 1):
            return  # another call took them, or the next call to end sends them
        batch, size = [], 0
        while waiting and (not batch or size + len(waiting[0].request.inputs) <= MAX_EMBED_INPUTS):
            batch.append(waiting.pop(0))
            size += len(batch[-1].request.inputs)
        if not waiting:
            del self._waiting[key]
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            _call(engine, batch, timeout)
        finally:
            self._in_flight[key] -= 1
            if not self._in_flight[key]:
                del self._in_flight[key]
            if key in self._waiting:
                gevent.spawn(self._send, key, engine, timeout)


def _call(engine: Any, batch: list[_Waiter], timeout: float | None) -> None:
    """Every waiter of `batch` gets its outcome, whatever happens here (a killed greenlet included)."""
    request = batch[0].request
    if len(batch) > 1:
        request = pb.EmbedRequest()
        request.CopyFrom(batch[0].request)  # model, dimensions, truncation and the first's request id
        for waiter in batch[1:]:
            request.inputs.extend(waiter.request.inputs)
    try:
        answer = engine.embed(request=request, timeout=timeout, metadata=batch[0].metadata)
    except ConduitError as exc:
        shared = len(batch) > 1 and exc.code == grpc.StatusCode.INVALID_ARGUMENT
        for waiter in batch:
            waiter.result.set(_ALONE) if shared else waiter.result.set_exception(exc)
        return
    except BaseException:
        for waiter in batch:
            if not waiter.result.ready():
                waiter.result.set(_ALONE)
        raise
    start = 0  # each waiter's share: its inputs' embeddings (an EmbedResponse's prompt_tokens is their sum)
    for waiter in batch:
        mine = answer.embeddings[start:start + len(waiter.request.inputs)]
        start += len(mine)
        waiter.result.set(EmbedAnswer(mine, sum(e.prompt_tokens for e in mine), answer.model))

