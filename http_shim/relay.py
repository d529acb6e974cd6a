"""Relays one HTTP request's engine calls to the client: as Server-Sent Events, or collected whole.

Every generation route parses its body into engine requests and hands them here. The relay does what
every route must do alike: route the model to its engines, track the stream for the drain, wait for
the first answer so early failures still get a real HTTP status, write heartbeats while the engine is
quiet, notice a client that left (and cancel its engine calls), and end a failed stream with an error
event. Each API formats the events (stream_fold.py) with an `EventWriter` of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from flask import Response, request

from conduit.v1 import engine_pb2 as pb

from . import sse
from .connection import client_gone
from .drain import Drain
from .engine_stream import IDLE, EngineStream
from .errors import APIError, internal_error
from .metrics import ShimMetrics
from .models import ServedModels
from .observe import REQUEST_ID_KEY, ROUTE_KEY
from .web import engine_metadata, engine_priority, request_id

log = logging.getLogger("http_shim")


class EventWriter(Protocol):
    """How one API writes a generation as SSE bytes."""

    # Written after a heartbeat interval of silence; clients must ignore it.
    heartbeat: bytes

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]: ...

    def finish(self) -> list[bytes]: ...  # the events that end a complete answer

    def fail(self, error: APIError) -> list[bytes]: ...  # ... and a stream the engine, a drain or a bug cut short


class Relay:
    def __init__(self, models: ServedModels, drain: Drain, metrics: ShimMetrics, heartbeat_s: float,
                 request_timeout_s: float | None) -> None:
        self._models = models
        self._drain = drain
        self._metrics = metrics
        self._heartbeat_s = heartbeat_s
        self._timeout_s = request_timeout_s

    def open(self, model: str, requests: list[pb.GenerateRequest],
             chain: Callable[[EngineStream, Callable[[list[pb.GenerateRequest]], EngineStream]], Any] | None = None,
             ) -> tuple[str, Any]:
        """Starts the engine calls on the engines serving `model`; returns the model's id and the
        stream, which the drain tracks until `close` (which `sse` and `collect` call). `chain(first,
        start)`: a stream of several rounds (the Responses API's file_search) made of the first one and
        more that `start` opens on the same engines; the drain tracks it."""
        metadata, rid, priority = engine_metadata(), request_id(), engine_priority()
        info, engine = self._models.route(model, metadata=metadata)

        def start(calls: list[pb.GenerateRequest]) -> EngineStream:
            for call in calls:
                call.priority = priority  # a Batch API line's calls go below interactive ones
            return EngineStream(engine, calls, self._timeout_s, metadata, rid)

        stream = start(requests)
        if chain is not None:
            stream = chain(stream, start)
        self._drain.add(stream)  # until its last byte: a drain waits for it, or cuts it at the deadline
        return info.id, stream

    def close(self, stream: EngineStream) -> None:
        """Cancels the calls still running (the engine stops within a step) and untracks them."""
        stream.cancel()
        self._drain.discard(stream)

    def sse(self, stream: EngineStream, writer: EventWriter) -> Response:
        """The streamed answer, once the engine's first answer arrived: an error before it (bad
        argument, queue full) raises here, for a real HTTP status."""
        try:
            first = stream.next(self._heartbeat_s)
            body = self._events(stream, first, writer, request.environ)
            response = Response(body, 200, sse.HEADERS, content_type=sse.CONTENT_TYPE)
        except BaseException:
            self.close(stream)
            raise
        # Also when the body was never iterated (its finally clause then never runs).
        response.call_on_close(lambda: self.close(stream))
        return response

    def collect(self, stream: EngineStream, on_response: Callable[[int, pb.GenerateResponse], object]) -> bool:
        """Hands the whole answer to `on_response` (an API's EventWriter's, or a `Collector`'s): the
        responses a stream gets. False when the client left before it (the calls are cancelled)."""
        environ = request.environ
        next_check = time.monotonic() + self._heartbeat_s
        try:
            while (item := stream.next(self._heartbeat_s)) is not None:
                # Check the client on every idle wait and, while tokens flow, at least once a
                # heartbeat interval: a client that gave up must not leave generation running.
                if item is IDLE or time.monotonic() >= next_check:
                    next_check = time.monotonic() + self._heartbeat_s
                    if client_gone(environ):
                        self._metrics.client_disconnects.labels(environ.get(ROUTE_KEY) or "").inc()
                        log.info("client left before the answer; cancelled")
                        return False
                if item is not IDLE:
                    on_response(*item)
        finally:
            self.close(stream)
        return True

    def _events(self, stream: EngineStream, first: Any, writer: EventWriter,
                environ: dict[str, Any]) -> Iterator[bytes]:
        """The SSE body. The finally clause runs when the client leaves (the failed write closes
        this generator), and cancels the engine calls so generation stops."""
        last_write = time.monotonic()
        ended = False  # the stream reached its end, answer or error; not ended: the client left
        self._metrics.streams_in_flight.inc()
        try:
            item = first
            while item is not None:
                events = [] if item is IDLE else writer.on_response(*item)
                if not events and time.monotonic() - last_write >= self._heartbeat_s:
                    if client_gone(environ):
                        return
                    events = [writer.heartbeat]
                for data in events:
                    yield data
                    last_write = time.monotonic()
                item = stream.next(self._heartbeat_s)
            yield from writer.finish()
            ended = True
        except APIError as error:
            log.info("stream ended by an error: %s %s", error.status, error.message)
            ended = True
            yield from writer.fail(error)
        except Exception:
            log.exception("internal error while streaming")
            ended = True
            yield from writer.fail(internal_error(environ.get(REQUEST_ID_KEY)))
        finally:
            self._metrics.streams_in_flight.dec()
            if not ended:
                self._metrics.client_disconnects.labels(environ.get(ROUTE_KEY) or "").inc()
                log.info("client left mid-stream; cancelled")
            stream.cancel()
