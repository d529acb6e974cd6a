"""Runs the Generate calls of one HTTP request together and yields their responses as they arrive.

A /v1/completions prompt list becomes one call per prompt; each is drained by its own greenlet
into one queue, so the request handler can wait with a timeout (to send heartbeats or notice a
departed client) and cancel every call at once.
"""

from __future__ import annotations

import gevent
from gevent.queue import Empty, Queue

from clients.engine_client import EngineClient, GenerateStream
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .errors import from_engine_error

_END = object()
Item = tuple[int, pb.GenerateResponse]


class Idle:
    """Returned by `next` when nothing arrived within the timeout."""


IDLE = Idle()


class EngineStream:
    def __init__(self, client: EngineClient, requests: list[pb.GenerateRequest], timeout_s: float | None) -> None:
        """`timeout_s` is each call's deadline; None waits as long as the engine works."""
        self._queue: Queue = Queue()
        self._streams = [client.generate(r, timeout=timeout_s) for r in requests]
        self._open = len(self._streams)
        for i, stream in enumerate(self._streams):
            gevent.spawn(self._drain, i, stream)

    def _drain(self, prompt_index: int, stream: GenerateStream) -> None:
        try:
            for response in stream:
                self._queue.put((prompt_index, response))
            self._queue.put((prompt_index, _END))
        except ConduitError as error:
            self._queue.put((prompt_index, error))

    def next(self, timeout_s: float) -> Item | Idle | None:
        """The next (prompt_index, response); IDLE after timeout_s of silence; None once all calls ended.

        Raises APIError when any call fails (the others are cancelled).
        """
        while self._open:
            try:
                prompt_index, item = self._queue.get(timeout=timeout_s)
            except Empty:
                return IDLE
            if item is _END:
                self._open -= 1
            elif isinstance(item, ConduitError):
                self.cancel()
                raise from_engine_error(item)
            else:
                return prompt_index, item
        return None

    def cancel(self) -> None:
        """Cancels calls still running; the engine stops generating for them within one step.

        The draining greenlets then end by themselves (their iterators raise Cancelled); killing
        them instead would interrupt grpc's own bookkeeping.
        """
        for stream in self._streams:
            stream.close()
