"""grpc on native threads, beside gevent's hub.

The shim does not put grpc in gevent mode (`grpc.experimental.gevent.init_gevent`): in that mode
every completion-queue wait is a task for gevent's thread pool and every streamed message wakes the
hub once, about a third of the shim's CPU per relayed token (benchmarks/RESULTS.md, issue 11).
Instead grpc keeps its own native threads and locks (the shim patches everything but `threading`,
see __main__.py), and this module is the seam between them and the greenlets:
- `ShimEngineClient` makes the small unary calls (models, health, tokenize) wait in gevent's
  thread pool, so a greenlet waiting on the engine never blocks the hub;
- an `Inbox` takes what native threads put (a Generate stream's reader thread, EngineStream) and
  wakes the greenlet that reads it once per batch, however many messages arrived meanwhile.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import gevent
from gevent.event import Event

from clients.engine_client import EngineClient, Metadata


class ShimEngineClient(EngineClient):
    """The blocking client, with its unary calls run off the hub (Generate is read by EngineStream)."""

    def _unary(self, method: Any, request: Any, timeout: float | None, metadata: Metadata | None) -> Any:
        return gevent.get_hub().threadpool.apply(super()._unary, (method, request, timeout, metadata))


class Empty(Exception):
    """`Inbox.get` waited its timeout and nothing came."""


class Inbox:
    """A queue that any thread may put into and one greenlet (on the hub's thread) takes from.

    A put from a native thread schedules one wake-up on the hub unless one is already pending,
    so items that arrive together cost one wake-up between them.
    """

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._ready = Event()
        self._wake_pending = False
        self._loop = gevent.get_hub().loop

    def put(self, item: object) -> None:
        """From any thread."""
        self._items.append(item)
        if not self._wake_pending:
            self._wake_pending = True
            self._loop.run_callback_threadsafe(self._wake)

    def _wake(self) -> None:  # on the hub, before the reader is switched to
        self._wake_pending = False
        self._ready.set()

    def get(self, timeout_s: float) -> Any:
        """The oldest item; raises Empty after timeout_s without one. Only from the hub's thread."""
        deadline = time.monotonic() + timeout_s
        while not self._items:
            self._ready.clear()
            if self._items:  # put between the check and the clear: its wake-up may have fired already
                break
            if not self._ready.wait(max(0.0, deadline - time.monotonic())):
                raise Empty
        return self._items.popleft()
