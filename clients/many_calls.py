"""Generate calls carried over one GenerateMany stream (engine.proto), for relays such as the shim.

A relay pays per gRPC message it receives (grpc's Python receive path; under gevent, a hand-off
through its thread pool), and Generate sends one message per call per engine step. GenerateMany
carries every call's messages of one step in one message: at 32 streams the shim relays with
about 40% less CPU (benchmarks/RESULTS.md).

`ManyCallsChannel.generate` behaves like `EngineClient.generate`: an iterator of one call's
GenerateResponse messages that raises ConduitError subclasses, whose `close()` cancels the call.
What grpc does for a Generate call, each call on the stream gets from clients/call_attempts.py
(one deadline, cancellation, no retry after an answer or a close) and, for where its attempts go,
from `_SameEngine` here:
- retries: a call that the engine refused UNAVAILABLE before any response (it is draining), or
  that was open without an answer on a stream that broke, is sent again, with RETRY_POLICY's
  codes, attempts and backoff (a stream that never opened was already retried by grpc's own policy);
  not for a routed call (`retries=False`): the router sends it to another replica at once instead;
- an engine that predates GenerateMany (UNIMPLEMENTED): the call, and every later one, goes out as
  a plain Generate call instead;
- the deadline: the engine ends the call DEADLINE_EXCEEDED, and the caller stops waiting then too.
The stream is opened on the first call and again after it ends; a call open on a stream that ends
fails with the stream's status (UNAVAILABLE when the engine went away).
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from clients.call_attempts import Attempt, AttemptedCall, Deadline
from clients.errors import ConduitError, from_rpc_error, from_status
from clients.replicas import RETRY_POLICY
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

Metadata = tuple[tuple[str, str], ...]
_HALF_CLOSE = None  # ends a stream's request iterator
_OK = grpc.StatusCode.OK.value[0]
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
# What grpc's retry policy for a Generate call says, applied to each call on the stream.
_RETRYABLE = {grpc.StatusCode[name] for name in RETRY_POLICY["retryableStatusCodes"]}
# The longest wait before each retry (capped at maxBackoff); the wait is drawn below it, as grpc's
# is (gRFC A6), so the calls of a stream that broke do not all come back at once.
_BACKOFF_S = [min(float(RETRY_POLICY["initialBackoff"].rstrip("s")) * RETRY_POLICY["backoffMultiplier"] ** i,
                  float(RETRY_POLICY["maxBackoff"].rstrip("s")))
              for i in range(RETRY_POLICY["maxAttempts"] - 1)]


class _StreamFailed:
    """What a stream that failed before any message hands its calls: grpc has already retried
    the stream itself (the channel's retry policy), so the calls are not sent again."""

    def __init__(self, error: ConduitError) -> None:
        self.error = error


class _Stream:
    """One GenerateMany call, the calls open on it, and a reader that hands each its messages."""

    def __init__(self, stub: Any, metadata: Metadata) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes: dict[int, queue.SimpleQueue] = {}
        self._lock = threading.Lock()
        self.ended = False
        self._rpc = stub.GenerateMany(iter(self._requests.get, _HALF_CLOSE), metadata=metadata)
        threading.Thread(target=self._read, name="generate-many", daemon=True).start()

    def start(self, call_id: int, inbox: queue.SimpleQueue, request: pb.GenerateRequest, log_request_id: str,
              timeout_s: float | None) -> bool:
        """False when the stream has already ended (nothing was sent)."""
        with self._lock:
            if self.ended:
                return False
            self._inboxes[call_id] = inbox
        self._requests.put(pb.GenerateManyRequest(call_id=call_id, start=request, log_request_id=log_request_id,
                                                  timeout_s=timeout_s or 0.0))
        return True

    def cancel(self, call_id: int) -> None:
        with self._lock:
            if self.ended or self._inboxes.pop(call_id, None) is None:
                return
        self._requests.put(pb.GenerateManyRequest(call_id=call_id, cancel=True))

    def close(self) -> None:
        self._requests.put(_HALF_CLOSE)
        self._rpc.cancel()

    def _read(self) -> None:
        error = from_status(grpc.StatusCode.UNAVAILABLE, "the engine ended the stream")
        received = False
        try:
            for batch in self._rpc:
                received = True
                for message in batch.messages:
                    self._dispatch(message)
        except grpc.RpcError as rpc_error:
            if rpc_error.code() != grpc.StatusCode.CANCELLED:  # cancelled: we closed it
                error = from_rpc_error(rpc_error)
        with self._lock:
            self.ended = True
            orphans, self._inboxes = list(self._inboxes.values()), {}
        self._requests.put(_HALF_CLOSE)
        for inbox in orphans:
            inbox.put(error if received else _StreamFailed(error))

    def _dispatch(self, message: pb.CallMessage) -> None:
        if message.HasField("response"):
            inbox = self._inboxes.get(message.call_id)
            if inbox is not None:
                inbox.put(message.response)
            return
        with self._lock:
            inbox = self._inboxes.pop(message.call_id, None)
        if inbox is None:  # cancelled by us meanwhile
            return
        end = message.end
        inbox.put(None if end.code == _OK else from_status(
            _STATUS_BY_NUMBER.get(end.code, grpc.StatusCode.UNKNOWN), end.message, dict(end.trailing_metadata)))


class _OnStream:
    """One attempt of a call on the channel's current GenerateMany stream: its messages, in order,
    as the stream's reader hands them over; `close()` cancels it there."""

    def __init__(self, channel: ManyCallsChannel, request: pb.GenerateRequest, log_request_id: str,
                 timeout_s: float | None) -> None:
        self._deadline = Deadline(timeout_s)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ended = False
        self._cancelled = False
        self.stream_failed = False  # its stream failed before any message: grpc retried that stream
        self._stream, self._call_id = channel.start(self._inbox, request, log_request_id, timeout_s)

    def __next__(self) -> pb.GenerateResponse:
        if self._ended:
            raise StopIteration
        item = self._get()
        if isinstance(item, pb.GenerateResponse):
            return item
        self._ended = True
        if item is None:
            raise StopIteration
        if isinstance(item, _StreamFailed):
            self.stream_failed = True
            item = item.error
        raise item

    def _get(self) -> pb.GenerateResponse | ConduitError | _StreamFailed | None:
        """The next item, waiting no longer than the deadline: on a stream the deadline is only a
        field of the call, so this stands in for grpc's own wait on a Generate call's deadline."""
        remaining = self._deadline.remaining()
        if remaining is None:
            return self._inbox.get()
        try:
            # A little past the engine's own deadline: its DEADLINE_EXCEEDED normally comes first.
            return self._inbox.get(timeout=remaining + 1.0)
        except queue.Empty:
            self.close()
            return from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def close(self) -> None:
        """Cancels it on the stream (a no-op once it has ended); a `next` waiting meanwhile raises
        Cancelled, as it would on a cancelled Generate call."""
        if not self._ended and not self._cancelled:
            self._cancelled = True
            self._stream.cancel(self._call_id)
            self._inbox.put(from_status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))


class _SameEngine:
    """Where one call's attempts go: the channel's GenerateMany stream, sent again after a backoff
    where grpc would retry a Generate call; plain Generate calls for an engine without GenerateMany."""

    def __init__(self, channel: ManyCallsChannel, request: pb.GenerateRequest, metadata: Metadata,
                 retries: bool = True) -> None:
        self._channel = channel
        self._request = request
        self._metadata = metadata
        self._log_request_id = dict(metadata).get(REQUEST_ID_METADATA_KEY, "")
        self._backoffs = iter(_BACKOFF_S if retries else ())

    def start(self, timeout_s: float | None) -> Attempt:
        if not self._channel.supported:
            return self._channel.plain_generate(self._request, timeout=timeout_s, metadata=self._metadata)
        return _OnStream(self._channel, self._request, self._log_request_id, timeout_s)

    def retry(self, failed: Attempt, error: ConduitError) -> bool:
        if not isinstance(failed, _OnStream):
            return False  # a plain Generate call: grpc's own policy has retried it
        if error.code == grpc.StatusCode.UNIMPLEMENTED:  # the engine predates GenerateMany
            self._channel.supported = False
            return True
        if failed.stream_failed:
            return False  # a stream that never opened: grpc's own policy has retried it
        if error.code not in _RETRYABLE:
            return False
        backoff = next(self._backoffs, None)
        if backoff is None:
            return False
        time.sleep(random.uniform(0, backoff))
        return True


class ManyCallsChannel:
    """Generate calls over one GenerateMany stream at a time on a channel's stub."""

    def __init__(self, stub: Any, metadata: Metadata, plain_generate: Callable[..., Any]) -> None:
        """`plain_generate(request, timeout=, metadata=)` makes a plain Generate call (the fallback)."""
        self._stub = stub
        self._metadata = tuple(metadata)
        self.plain_generate = plain_generate
        self._ids: Iterator[int] = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self.supported = True  # False once an engine answered UNIMPLEMENTED

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None,
                 metadata: Metadata = (), retries: bool = True) -> AttemptedCall:
        """`retries=False`: no call is sent again after a refusal or a broken stream (whoever
        routes it elsewhere owns its retries); an engine without GenerateMany still gets it as Generate."""
        return AttemptedCall(_SameEngine(self, request, tuple(metadata), retries), timeout)

    def start(self, inbox: queue.SimpleQueue, request: pb.GenerateRequest, log_request_id: str,
              timeout_s: float | None) -> tuple[_Stream, int]:
        """Starts a call on the current stream (opened anew when there is none or it ended)."""
        while True:
            with self._lock:
                if self._stream is None or self._stream.ended:
                    self._stream = _Stream(self._stub, self._metadata)
                stream, call_id = self._stream, next(self._ids)
            if stream.start(call_id, inbox, request, log_request_id, timeout_s):
                return stream, call_id

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
