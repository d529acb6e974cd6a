"""The rounds of a response whose tools this server runs (file_search, MCP), read as one engine stream.

The model's call of a hosted tool is not the end of the response: when a round's stream ends with calls
pending, `next` yields the marker RUNNING (the writer's "the calls run now" events), runs them, yields
RAN (their results' events; while they run, `next` gives IDLE each timeout, so the relay writes heartbeats
and notices a client that left), then opens the next round: the same request with the round's answer and
calls and each call's result as a tool message. A run whose calls are spent stops being offered; a
forced tool is forced in the first round only. A round that has a function call (for the client) or an
MCP approval request ends the response. So streamed and whole answers, the drain, a client leaving and
cancel work as for any response.

A run (file_search.FileSearchRun, mcp.run.McpRun) has `pending` calls (each with `call_id`,
`model_name`, `arguments`), `run_pending()`, `tool_answer(call)`, `names()` and `can_call_again()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent

from conduit.v1 import engine_pb2 as pb

from ..engine_stream import IDLE
from ..errors import APIError

RUNNING, RAN = -2, -3  # the markers' prompt indexes (an engine's are >= 0)
_ENDS_RESPONSE = ("function_call", "mcp_approval_request")


class ToolRounds:
    """`open_round` starts an engine stream for a request; `round_items` gives the output items the
    writer wrote in the current round, to replay it to the model."""

    def __init__(self, first: Any, generate: pb.GenerateRequest, runs: list[Any],
                 open_round: Callable[[pb.GenerateRequest], Any]) -> None:
        self.current = first
        self.generate = generate
        self.runs = runs
        self.open_round = open_round
        self.round_items: Callable[[], list[dict[str, Any]]] = lambda: []
        self._step: int | None = None  # RUNNING, RAN: the marker to answer next
        self._rounds = 0
        self._interrupted: APIError | None = None
        self._running: gevent.Greenlet | None = None  # the calls of this round, running

    def next(self, timeout_s: float) -> Any:
        if self._interrupted is not None:
            raise self._interrupted
        if self._step == RUNNING:
            if self._running is None:
                self._running = gevent.spawn(self._run_pending)
            self._running.join(timeout_s)
            if not self._running.ready():
                return IDLE
            self._running.get()  # raises what it raised (a bug: the relay's 500 path)
            self._running = None
            self._step = RAN
            return RAN, None
        if self._step == RAN:
            self._step = None
            if not self._next_round():
                return None
        item = self.current.next(timeout_s)
        if item is None and any(run.pending for run in self.runs):
            self._step = RUNNING
            return RUNNING, None
        return item

    def _run_pending(self) -> None:
        for run in self.runs:
            run.run_pending()

    def _next_round(self) -> bool:
        """The next round's stream, with the calls' results; False when the round ends the response."""
        items = self.round_items()
        done = [(run, run.pending) for run in self.runs]
        for run in self.runs:
            run.pending = []
        if any(i["type"] in _ENDS_RESPONSE for i in items):
            return False
        self._rounds += 1
        request = pb.GenerateRequest()
        request.CopyFrom(self.generate)
        request.request_id = f"{self.generate.request_id}-{self._rounds}"
        text = "".join(p.get("text", "") for i in items if i["type"] == "message" for p in i["content"])
        calls = [pb.ToolCall(id=c.call_id, name=c.model_name, arguments="".join(c.arguments) or "{}")
                 for _, called in done for c in called]
        request.chat.messages.append(pb.ChatMessage(role="assistant", content=text, tool_calls=calls))
        for run, called in done:
            for call in called:
                request.chat.messages.append(pb.ChatMessage(role="tool", tool_call_id=call.call_id,
                                                            content=run.tool_answer(call)))
        spent = {name for run in self.runs if not run.can_call_again() for name in run.names()}
        if spent:
            kept = [t for t in self.generate.chat.tools if t.name not in spent]
            del request.chat.tools[:]
            request.chat.tools.extend(kept)
        hosted = {name for run in self.runs for name in run.names()}
        forced = request.chat.tool_choice
        if forced.function_name in hosted or (forced.mode == pb.ToolChoice.MODE_REQUIRED and hosted):
            forced.CopyFrom(pb.ToolChoice(mode=pb.ToolChoice.MODE_AUTO))  # forced: the first call only
        if not request.chat.tools:
            request.chat.tool_choice.CopyFrom(pb.ToolChoice(mode=pb.ToolChoice.MODE_NONE))
        self.generate = request
        self.current = self.open_round(request)
        return True

    def interrupt(self, error: APIError) -> None:
        self._interrupted = error
        self.current.interrupt(error)

    def cancel(self) -> None:
        self.current.cancel()
