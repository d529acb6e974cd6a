"""GenerateMany: many Generate calls over one bidirectional stream (engine.proto).

A relay such as the HTTP shim pays per gRPC message it receives (grpc's Python receive path, a
gevent hand-off), and Generate sends one message per call per engine step. Over GenerateMany the
messages of every call that the same step produced travel as one GenerateManyResponse: the
engine hands a step's outputs to the event loop in one hop (server.py), each call's task turns its
events into messages as soon as it runs, and the writer, woken by the first of them, runs after
all of them. No timer: a first token is not held back.

Each call runs the servicer's own Generate with a `CallContext` standing in for grpc's, so a
call's messages, errors and trailing metadata are exactly what Generate gives; only the framing
differs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

log = logging.getLogger(__name__)

# How often an idle stream looks whether the engine began draining (it then ends, so that its
# caller opens its next stream elsewhere or learns the engine is going).
DRAIN_CHECK_S = 0.5

Generate = Callable[[pb.GenerateRequest, "CallContext"], AsyncIterator[pb.GenerateResponse]]


class CallEnded(Exception):
    """Raised by CallContext.abort: ends the call with a status, as grpc's abort ends an RPC."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The part of grpc.aio.ServicerContext that Generate uses, for one call of a GenerateMany stream."""

    def __init__(self, stream_context: grpc.aio.ServicerContext, log_request_id: str) -> None:
        self._stream_context = stream_context
        self._log_request_id = log_request_id
        self.trailing_metadata: dict[str, str] = {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        own = ((REQUEST_ID_METADATA_KEY, self._log_request_id),) if self._log_request_id else ()
        inherited = tuple((k, v) for k, v in self._stream_context.invocation_metadata() or ()
                          if k != REQUEST_ID_METADATA_KEY)
        return own + inherited

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> None:
        self.trailing_metadata = dict(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise CallEnded(code, details)


def _end(call_id: int, code: grpc.StatusCode, message: str = "",
         trailing: dict[str, str] | None = None) -> pb.CallMessage:
    return pb.CallMessage(call_id=call_id, end=pb.CallEnd(code=code.value[0], message=message,
                                                          trailing_metadata=trailing or {}))


class ManyCalls:
    """One GenerateMany stream: starts and cancels calls as the requests say, and yields what
    they produce in batches (everything ready when the writer wakes: a step's messages)."""

    def __init__(self, generate: Generate, context: grpc.aio.ServicerContext, draining: Callable[[], bool]) -> None:
        self._generate = generate
        self._context = context
        self._draining = draining
        self._ready: list[pb.CallMessage] = []
        self._wake = asyncio.Event()
        self._calls: dict[int, asyncio.Task] = {}
        self._requests_done = False

    def _put(self, message: pb.CallMessage) -> None:
        self._ready.append(message)
        self._wake.set()

    async def _run_call(self, call_id: int, request: pb.GenerateRequest, log_request_id: str,
                        timeout_s: float) -> None:
        context = CallContext(self._context, log_request_id)
        try:
            async with asyncio.timeout(timeout_s or None):
                async for response in self._generate(request, context):
                    self._put(pb.CallMessage(call_id=call_id, response=response))
            self._put(_end(call_id, grpc.StatusCode.OK))
        except CallEnded as ended:
            self._put(_end(call_id, ended.code, ended.details, context.trailing_metadata))
        except TimeoutError:
            self._put(_end(call_id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        except asyncio.CancelledError:
            self._put(_end(call_id, grpc.StatusCode.CANCELLED, "the caller cancelled the call"))
            raise
        except Exception:  # noqa: BLE001 - one call's failure must not end the others
            log.exception("call %d of a GenerateMany stream failed", call_id)
            self._put(_end(call_id, grpc.StatusCode.INTERNAL, "the engine failed on this call; see its log"))
        finally:
            self._calls.pop(call_id, None)
            self._wake.set()

    def _call_done(self, call_id: int, task: asyncio.Task) -> None:
        """A call's task is over. One cancelled before its first step never ran its body (which
        ends the call and forgets it): do that here, or the stream would wait on it for ever."""
        if self._calls.get(call_id) is task:
            del self._calls[call_id]
            self._put(_end(call_id, grpc.StatusCode.CANCELLED, "the caller cancelled the call"))

    async def _read_requests(self, requests: AsyncIterator[pb.GenerateManyRequest]) -> None:
        try:
            async for request in requests:
                action = request.WhichOneof("action")
                if action == "start":
                    if request.call_id in self._calls:
                        self._put(_end(request.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                                       f"call_id {request.call_id} is already open on this stream"))
                        continue
                    task = asyncio.create_task(self._run_call(
                        request.call_id, request.start, request.log_request_id, request.timeout_s))
                    self._calls[request.call_id] = task
                    task.add_done_callback(lambda done, call_id=request.call_id: self._call_done(call_id, done))
                elif action == "cancel":
                    task = self._calls.get(request.call_id)
                    if task is not None:  # else it has ended already: nothing to cancel
                        task.cancel()
                else:
                    self._put(_end(request.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                                   "a GenerateManyRequest needs `start` or `cancel`"))
        finally:
            self._requests_done = True
            self._wake.set()

    def _finished(self) -> bool:
        """No call open, and the caller will start none (it half-closed, or the engine drains)."""
        return not self._calls and not self._ready and (self._requests_done or self._draining())

    async def responses(self, requests: AsyncIterator[pb.GenerateManyRequest]) -> AsyncIterator[pb.GenerateManyResponse]:
        reader = asyncio.create_task(self._read_requests(requests))
        try:
            while not self._finished():
                if self._calls:  # each call's end wakes this
                    await self._wake.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wake.wait(), DRAIN_CHECK_S)
                    except TimeoutError:
                        continue
                self._wake.clear()
                if self._ready:
                    batch, self._ready = self._ready, []
                    yield pb.GenerateManyResponse(messages=batch)
        finally:
            reader.cancel()
            for task in list(self._calls.values()):
                task.cancel()
