"""The requests in flight and what the engine tells them: the outputs step() returns.

A request is held here from submit() until its last event is out. What a step (or an abort, or
the drain's end) tells a request gathers here as one RequestOutput per telling, in the order
it happened, until the loop takes them (`take_outputs`): the request's outbox (its PromptEvent),
each choice's new output (a ChunkEvent) and a choice's end (a FinalEvent); a request cut short
(cancelled, failed, shut down) gets one final per choice with the reason. Ending a choice frees
its blocks and counts it in the metrics. It is the job vLLM's OutputProcessor does for the
outputs of its EngineCore.step().
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_service.core.events import Event, FinalEvent, FinishReason
from engine_service.core.metrics import StepRecorder
from engine_service.core.params import InvalidRequest
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence


@dataclass
class RequestOutput:
    """A request's events from one step (or an abort, a drain's end), in order."""

    request: Request
    events: list[Event]


class Requests:
    def __init__(self, scheduler: Scheduler, recorder: StepRecorder) -> None:
        self.scheduler = scheduler
        self.recorder = recorder
        self._live: dict[str, Request] = {}  # every request submitted and not yet finished
        self._outputs: list[RequestOutput] = []  # what the loop delivers next

    def add(self, request: Request) -> None:
        """Hold a submitted request; a request_id runs once at a time."""
        if request.request_id in self._live:
            raise InvalidRequest(f"request_id {request.request_id!r} is already running", "request_id")
        self._live[request.request_id] = request

    def get(self, request_id: str) -> Request | None:
        return self._live.get(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._live

    def all(self) -> list[Request]:
        return list(self._live.values())

    def send(self, request: Request) -> None:
        """Out with what `request` has to tell now: its outbox, each choice's new output, and the
        final of each choice that ended normally."""
        events, request.outbox = request.outbox, []
        request.unsent_steps = 0
        for seq in request.sequences:
            if seq.output is not None:
                events += seq.output.chunks()
            if seq.finished and not seq.finish_reason.abnormal and not seq.final_sent:
                seq.final_sent = True
                if seq.output is None:  # an Embed's input
                    events.append(FinalEvent(seq.index, seq.finish_reason, seq.prompt_len, 0,
                                             embedding=seq.embedding))
                    continue
                events.append(FinalEvent(seq.index, seq.finish_reason, seq.prompt_len, seq.num_output,
                                         seq.output.matched_stop, tool_calls=seq.output.tool_calls,
                                         reasoning_tokens=seq.output.reasoning_tokens))
        if request.finished:
            self._forget(request)
        if events:
            self._outputs.append(RequestOutput(request, events))

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """A choice ended on its own (stop, length, tool calls): its blocks go back; its final
        goes out with the request's next send()."""
        seq.finish_reason = reason
        self.scheduler.release(seq)
        adapter = seq.request.adapter
        self.recorder.finished(reason.value, seq.request.arrival, adapter=adapter.name if adapter else "")

    def end(self, request: Request, reason: FinishReason) -> None:
        """End every unfinished choice of `request` with `reason` (CANCELLED, ERROR, SHUTDOWN) and
        tell its sink; a request not yet in the scheduler (no sequences) gets a final per choice."""
        for seq in request.sequences:
            for fork in seq.forks:
                fork.finish_reason = reason
            seq.forks = []
            if not seq.finished:
                seq.finish_reason = reason
                self.scheduler.release(seq)
        unfinished = (sum(1 for s in request.sequences if s.finish_reason is reason) if request.sequences
                      else request.params.n)
        self.recorder.finished(reason.value, request.arrival, unfinished,
                               request.adapter.name if request.adapter else "")
        self._forget(request)
        finals = [FinalEvent(s.index, reason, s.prompt_len, s.num_output) for s in request.sequences]
        self._outputs.append(RequestOutput(request, finals or [FinalEvent(i, reason, len(request.prompt_ids), 0)
                                                               for i in range(request.params.n)]))

    def take_outputs(self) -> list[RequestOutput]:
        """What was told since the last call, in order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    def _forget(self, request: Request) -> None:
        self._live.pop(request.request_id, None)
        self.scheduler.suspects.discard(request.request_id)


def deliver(outputs: list[RequestOutput]) -> None:
    """Each request's events to its sink, on the calling thread: the engine loop's own consumer of
    outputs unless it was built with another (serving/server.py hops them to the gRPC loop first)."""
    for output in outputs:
        output.request.sink(output.events)
