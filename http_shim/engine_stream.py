"""Runs the Generate calls of one HTTP request together and yields their responses as they arrive.

A /v1/completions prompt list becomes one call per prompt; each is drained by its own greenlet
into one queue, so the request handler can wait with a timeout (to send heartbeats or notice a
departed client) and cancel every call at once. A drain past its deadline interrupts the stream:
the next `next` raises the error it was given.

The calls are the engine client's shared ones (`generate_shared`): all of the shim's calls to one
engine travel on one GenerateMany stream, one gRPC message per engine step instead of one per call
and step. The ways to relay that this beat (reader threads, a channel per call, batched SSE writes)
are measured in benchmarks/RESULTS.md (issue 11).
"""

from __future__ import annotations

import gevent
from gevent.queue import Empty, Queue

from clients.call_attempts import AttemptedCall
from clients.engine_client import EngineClient, GenerateStream, Metadata
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .errors import APIError, from_engine_error
from .live_generation import LIVE_GENERATION

_END = object()
Item = tuple[int, pb.GenerateResponse]


IDLE = object()  # what `next` returns when nothing arrived within the timeout


class EngineStream:
    def __init__(self, client: EngineClient, requests: list[pb.GenerateRequest], timeout_s: float | None,
                 metadata: Metadata = (), request_id: str | None = None) -> None:
        """`timeout_s` is each call's deadline; None waits as long as the engine works.
        `request_id` (the HTTP request's) goes into the messages of engine failures."""
        self._queue: Queue = Queue()
        self._request_id = request_id
        self._interrupted: APIError | None = None
        self._streams = [client.generate_shared(r, timeout=timeout_s, metadata=metadata) for r in requests]
        self._open = len(self._streams)
        for i, stream in enumerate(self._streams):
            gevent.spawn(self._drain, i, stream)

    def _drain(self, prompt_index: int, stream: AttemptedCall | GenerateStream) -> None:
        LIVE_GENERATION.enter()
        try:
            for response in stream:
                self._queue.put((prompt_index, response))
            self._queue.put((prompt_index, _END))
        except Exception as error:  # noqa: BLE001 - `next` raises it in the handler (500, logged)
            self._queue.put((prompt_index, error))
        finally:
            LIVE_GENERATION.leave()

    def next(self, timeout_s: float) -> Item | object | None:
        """The next (prompt_index, response); IDLE after timeout_s of silence; None once all calls ended.

        Raises APIError when any call fails (the others are cancelled) or the stream was interrupted.
        """
        while self._open:
            if self._interrupted is not None:
                raise self._interrupted
            try:
                prompt_index, item = self._queue.get(timeout=timeout_s)
            except Empty:
                return IDLE
            if item is _END:
                self._open -= 1
            elif isinstance(item, Exception):
                self.cancel()
                if self._interrupted is not None:  # the cancellation we caused, not an engine failure
                    raise self._interrupted
                if isinstance(item, ConduitError):
                    raise from_engine_error(item, self._request_id)
                raise item
            else:
                return prompt_index, item
        return None

    def interrupt(self, error: APIError) -> None:
        """Makes the waiting (or next) `next` raise `error`, and cancels the engine calls."""
        self._interrupted = error
        self._queue.put((-1, error))  # wakes a `next` waiting on the queue
        self.cancel()

    def cancel(self) -> None:
        """Cancels calls still running; the engine stops generating for them within one step. The draining
        greenlets then end by themselves (killing them would interrupt grpc's own bookkeeping)."""
        for stream in self._streams:
            stream.close()
