"""How often a request's tokens leave the engine: the stream interval.

Fewer, larger messages cost the relay and the clients less per token at high concurrency; every
token at once costs the least latency. A request's first token and its end always go at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line reads the constants below without loading torch
    from engine_service.core.sequence import Request

# Auto stream interval: about this many requests' messages per step however big the batch (the
# relay's CPU per step stays bounded, and on a shared CPU that is the engine's), with text still
# arriving every few steps. At 32 streams: 4 tokens a message; up to 8 streams: every token.
AUTO_STREAMS_PER_STEP = 8
AUTO_MAX_STREAM_INTERVAL = 4


def auto_stream_interval(requests: int) -> int:
    """The auto stream interval of a step that gives tokens to this many requests."""
    return min(AUTO_MAX_STREAM_INTERVAL, -(-requests // AUTO_STREAMS_PER_STEP))


class StreamPacing:
    def __init__(self, interval: int) -> None:
        """`interval`: steps a request's tokens gather before they are sent; 0: auto."""
        self.interval = interval

    def describe(self) -> str:
        if self.interval == 0:
            return f"every token up to {AUTO_STREAMS_PER_STEP} requests a step, grouped past that (--stream-interval auto)"
        return "every token" if self.interval == 1 else f"a message every {self.interval} steps (--stream-interval {self.interval})"

    def due(self, stepped: list[Request]) -> list[Request]:
        """Of the requests this step gave tokens to, those whose events go out now: every interval
        steps; at once for the first token (its PromptEvent waits in the outbox) and a choice's end."""
        interval = self.interval or auto_stream_interval(len(stepped))
        due = []
        for request in stepped:
            request.unsent_steps += 1
            if (request.unsent_steps >= interval or bool(request.outbox)
                    or any(seq.finished and not seq.final_sent for seq in request.sequences)):
                due.append(request)
        return due
