"""What other threads hand the engine loop: new requests, aborts, and the drain.

The loop owns everything else and runs on one thread; these are the only calls that cross into
it, under one lock, and each wakes the loop if it is idle. The loop takes what arrived at the
start of every step (`take`). `interactive_waiting` is read without the lock, between a batch step's
layers (core/engine_core.py: such a step gives way to an interactive arrival).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from engine_service.core.params import Draining, QueueFull
from engine_service.core.sequence import Request


class Inbox:
    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._requests: list[Request] = []
        self._aborts: list[str] = []
        self._interactive = 0  # of the requests not yet taken, those that are not batch work
        self._draining = False  # no new requests; the loop ends once the rest are done or cut
        self._drain_deadline = math.inf  # time.monotonic()

    def put(self, request: Request, waiting: int, free_slots: int, admit: Callable[[], None]) -> None:
        """Queue `request` behind the `waiting` the scheduler holds; `admit()` (under the lock, so a
        drain cannot slip in between) may refuse it. Raises Draining or QueueFull at once.

        The queue is full when `max_waiting` would wait beside the `free_slots` of the running batch:
        requests that arrive together while a slot is free do not count against the queue until the
        loop's next step has taken them (under KV-cache pressure a free slot may not take one, and the
        queue holds up to `free_slots` more)."""
        with self._lock:
            if self._draining:
                raise Draining("the engine is draining (shutting down) and takes no new requests; "
                               "retry on another replica")
            if waiting + len(self._requests) >= self.max_waiting + free_slots:
                raise QueueFull(f"the engine's queue is full ({self.max_waiting} waiting); retry later")
            admit()
            self._requests.append(request)
            self._interactive += not request.batch
        self._wake.set()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def take(self) -> tuple[list[Request], list[str]]:
        """What arrived since the last call: requests, then aborts (of any request, queued or running)."""
        with self._lock:
            requests, self._requests = self._requests, []
            aborts, self._aborts = self._aborts, []
            self._interactive = 0
        return requests, aborts

    def pending_adapters(self) -> set:
        """The LoRA adapters of the requests submitted and not yet taken."""
        with self._lock:
            return {request.adapter for request in self._requests if request.adapter is not None}

    def interactive_waiting(self) -> bool:
        """Whether an interactive request arrived since the last `take` (a snapshot, without the lock)."""
        return self._interactive > 0

    def __len__(self) -> int:
        return len(self._requests)

    def drain(self, deadline: float) -> None:
        """Refuse new requests from now on; the loop ends when the rest are done or at `deadline`
        (time.monotonic()). A later call may bring the deadline forward."""
        with self._lock:
            self._draining = True
            self._drain_deadline = min(self._drain_deadline, deadline)
        self._wake.set()

    @property
    def draining(self) -> bool:
        return self._draining

    def past_deadline(self) -> bool:
        return time.monotonic() >= self._drain_deadline

    def close(self) -> None:
        """The loop is over: refuse from now on, and forget what was not taken (the engine ends it)."""
        with self._lock:
            self._draining = True
            self._requests = []
            self._interactive = 0

    def wake(self) -> None:
        self._wake.set()

    def wait(self, timeout_s: float) -> None:
        """Until something arrives (or `wake`), at most `timeout_s`."""
        self._wake.wait(timeout=timeout_s)
        self._wake.clear()
