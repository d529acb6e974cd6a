"""Graceful drain: once asked to stop, refuse new generations, let running ones finish, then stop.

The shim counts the generations it is running (a stream counts until its last byte). Draining
makes /health answer 503 and new generation requests 503 with Retry-After, so load balancers
and clients move on, while what runs finishes normally (streams end with `data: [DONE]`). At the
deadline the generations still running are cut: each ends with an OpenAI error (a stream's last
event is that error, never [DONE], so a cut answer never looks complete).
"""

from __future__ import annotations

from typing import Any

from gevent.event import Event

from .errors import APIError
from .metrics import ShimMetrics

# Retry-After (seconds) of a generation refused while draining: another replica can take it now.
DRAIN_RETRY_AFTER_S = 1


# What a generation is told once the server stops: refused at its admission, or cut at the deadline.
REFUSED = "The server is shutting down and accepts no new requests; retry (another replica will answer)."
CUT = "The server shut down before this answer was complete; retry the request."


def _shutting_down(message: str) -> APIError:
    headers = {"Retry-After": str(DRAIN_RETRY_AFTER_S), "Connection": "close"}
    return APIError(503, message, "server_error", None, "server_shutting_down", headers)


class _Admitted:
    """A generation request between its admission and the start of its engine calls."""

    def interrupt(self, error: APIError) -> None:
        pass  # it checks nothing more before it starts; its engine calls are interrupted then


class Drain:
    """Shared by the request handlers (admit, track) and the signal handler (start, wait, cut)."""

    def __init__(self, metrics: ShimMetrics) -> None:
        self.draining = False
        self._running: set[Any] = set()  # what runs: each has `interrupt(error)`, for a cut
        self._idle = Event()
        self._idle.set()
        self._metrics = metrics

    @property
    def running(self) -> int:
        return len(self._running)

    def admit(self) -> _Admitted:
        """Raises the 503 a new generation gets while draining; otherwise a token to `discard`
        once the request has registered its engine calls (no drain may finish in between)."""
        if self.draining:
            raise _shutting_down(REFUSED)
        token = _Admitted()
        self.add(token)
        return token

    def add(self, job: Any) -> None:
        self._running.add(job)
        self._idle.clear()

    def discard(self, job: Any) -> None:
        """Idempotent: a job may end through several paths (stream end, response close)."""
        self._running.discard(job)
        if not self._running:
            self._idle.set()

    def start(self) -> None:
        self.draining = True
        self._metrics.draining.set(1)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing runs; False when `timeout_s` passed first."""
        return self._idle.wait(timeout_s)

    def cut(self) -> int:
        """Ends every running generation with the CUT error; returns how many there were."""
        jobs = list(self._running)
        for job in jobs:
            job.interrupt(_shutting_down(CUT))
        return len(jobs)
