"""One call's per-call semantics, written once: its deadline, its cancellation, and a retry only
before its first answer.

A relay's call may take several attempts: a GenerateMany call sent again on its engine's stream
after a backoff (clients/many_calls.py), or a routed call sent to another replica
(http_shim/routing/router.py). Where the next attempt goes, and after which failures, is a
`Placement`'s to say; what every call does alike is here, in `AttemptedCall`:
- one deadline for the whole call: each attempt is sent with the time that is left of it;
- no retry once an answer came (its client has seen output: a retry would repeat it), nor once
  the call was closed;
- `close()` cancels the attempt running; a `next` waiting on it then raises Cancelled.
A plain Generate call gets all three from grpc itself (the service config in clients/replicas.py).
"""

from __future__ import annotations

import time
from typing import Protocol

from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb


class Deadline:
    """When a call must have ended; no timeout: never."""

    def __init__(self, timeout_s: float | None) -> None:
        self._at = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left, at least 1 ms (a call sent at the last moment still carries a deadline:
        0 would mean none); None for no deadline."""
        return None if self._at is None else max(self._at - time.monotonic(), 1e-3)


class Attempt(Protocol):
    """One try of a call: its responses in order (raising ConduitError), cancelled by `close()`."""

    def __next__(self) -> pb.GenerateResponse: ...

    def close(self) -> None: ...


class Placement(Protocol):
    """Where a call's attempts go, and which failures are tried again."""

    def start(self, timeout_s: float | None) -> Attempt | None:
        """The next attempt, sent with `timeout_s` (None: no deadline); None when there is nowhere
        left to send it (the failure before it then stands). The first start raises ConduitError
        instead of giving None."""
        ...

    def retry(self, failed: Attempt, error: ConduitError) -> bool:
        """Whether `failed`, which answered nothing, is tried again after `error`; may wait a
        backoff before saying yes."""
        ...


class AttemptedCall:
    """One Generate call as a relay sees it, over as many attempts as its placement allows: an
    iterator of its responses that raises ConduitError subclasses; `close()` cancels it."""

    def __init__(self, placement: Placement, timeout_s: float | None) -> None:
        self._placement = placement
        self._deadline = Deadline(timeout_s)
        self._answered = False
        self._closed = False
        self._attempt: Attempt = placement.start(self._deadline.remaining())

    def __iter__(self) -> AttemptedCall:
        return self

    def __next__(self) -> pb.GenerateResponse:
        while True:
            try:
                response = next(self._attempt)
            except ConduitError as error:
                if self._answered or self._closed or not self._placement.retry(self._attempt, error):
                    raise
                if self._closed:  # closed during the backoff
                    raise
                attempt = self._placement.start(self._deadline.remaining())
                if attempt is None:
                    raise
                self._attempt = attempt
                if self._closed:  # closed while it was being sent
                    attempt.close()
                continue
            self._answered = True
            return response

    def close(self) -> None:
        """Cancel the call if it is still running (a no-op once it has ended)."""
        self._closed = True
        self._attempt.close()

    def __enter__(self) -> AttemptedCall:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
