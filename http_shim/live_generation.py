"""Whether the shim is generating for someone: background work (vector store ingestion) paces itself
while it is, so it leaves the cores to the streams people are waiting on (benchmarks/RESULTS.md,
"chat beside ingestion")."""

from __future__ import annotations

import time

LINGER_S = 2.0  # a client's next request usually follows its last within this: still live in between


class LiveGeneration:
    """Open Generate calls; the shim's greenlets share one thread, so plain numbers."""

    def __init__(self) -> None:
        self.open = 0
        self.last_left = float("-inf")

    def enter(self) -> None:
        self.open += 1

    def leave(self) -> None:
        self.open -= 1
        self.last_left = time.monotonic()

    def active(self) -> bool:
        return self.open > 0 or time.monotonic() - self.last_left < LINGER_S


LIVE_GENERATION = LiveGeneration()
