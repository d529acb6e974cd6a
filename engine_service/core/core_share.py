"""Cores shared by demand between engines on one host (`--core-share FILE`): the launcher's chat engine
and the embedding engine beside it.

Torch's OpenMP threads wait for each other after every op, so two engines whose threads together
outnumber the cores stall each other at those waits (on 2 cores a chat stream's longest token gap went
from ~30 ms to 1.3 s beside embedding traffic: benchmarks/RESULTS.md). A fixed split avoids that but
leaves the chat engine on its share of the cores while the embedding engine sits idle, which is most of
the time. So the split follows demand instead:

- The embedding engine marks in FILE, a float64 in shared memory, until when it has work:
  `time.monotonic()` (one clock for every process of the host) plus LEASE_S at each step, plus
  LINGER_S once its queue is empty. It keeps its own small thread count throughout.
- The chat engine reads the mark before each step and runs the step on its share of the cores
  (`--core-share-threads`) while the mark lies ahead, on all of its threads (`--threads`) otherwise.

So the two engines' threads outnumber the cores for at most one chat step after the embedding engine
gets work. LINGER_S keeps the chat engine on its share across the short gaps between an embedding
client's requests; LEASE_S bounds how long a mark outlives an embedding engine that was killed mid-step.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = logging.getLogger(__name__)

MARK = struct.Struct("=d")  # CLOCK_MONOTONIC seconds until which the marking engine has work
LINGER_S = 0.1
LEASE_S = 10.0


class CoreShare:
    """The mark in FILE, created (zero: no work) when missing or short."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < MARK.size:
                os.ftruncate(fd, MARK.size)
            self._map = mmap.mmap(fd, MARK.size)
        finally:
            os.close(fd)

    def busy_until(self) -> float:
        return MARK.unpack_from(self._map)[0]

    def mark(self, until: float) -> None:
        MARK.pack_into(self._map, 0, until)

    def working(self) -> None:
        """The marking engine starts a step."""
        self.mark(time.monotonic() + LEASE_S)

    def idle(self) -> None:
        """The marking engine has nothing left to do."""
        self.mark(time.monotonic() + LINGER_S)

    def marked(self) -> bool:
        return time.monotonic() < self.busy_until()

    def close(self) -> None:
        self._map.close()


class YieldingThreads:
    """The chat engine's side: before each step, its torch threads as the mark asks."""

    def __init__(self, share: CoreShare, threads: int, shared_threads: int, gauge: Gauge | None = None) -> None:
        import torch

        self._set = torch.set_num_threads
        self.share = share
        self.threads = threads
        self.shared_threads = min(shared_threads, threads)
        self.current = torch.get_num_threads()
        self.gauge = gauge  # conduit:cpu_threads
        if gauge is not None:
            gauge.set(self.current)

    def before_step(self) -> None:
        wanted = self.shared_threads if self.share.marked() else self.threads
        if wanted != self.current:
            self._set(wanted)
            log.debug("torch threads %d -> %d (%s)", self.current, wanted,
                      "another engine has work" if wanted < self.threads else "the other engines are idle")
            self.current = wanted
            if self.gauge is not None:
                self.gauge.set(wanted)
