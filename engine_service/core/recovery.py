"""What a failed step does: fail only the request at fault, and let the others go on.

When it can tell which request is at fault it fails that one: a step of one request fails that
request, and so does a step that held one suspect beside requests that have all had tokens through
steps (not a new arrival, which may be the one at fault). Otherwise the step's requests are rewound
(their cache is recomputed, as after a preemption) and become suspects, which later steps hold
at most one of at a time (the scheduler's rule), so the next failure names one request. A
suspect that gets a token through is cleared. Requests failed so end with FinishReason.ERROR
(INTERNAL), with the traceback in the log under their id. A fault that does not come back costs
only the recomputation.
"""

from __future__ import annotations

import logging

from conduit_common.logs import request_extra
from engine_service.core.choices import Choices
from engine_service.core.events import FinishReason
from engine_service.core.requests import Requests
from engine_service.core.scheduler import ScheduledBatch, Scheduler
from engine_service.core.sequence import Request, Sequence

log = logging.getLogger(__name__)


class StepRecovery:
    def __init__(self, scheduler: Scheduler, requests: Requests, choices: Choices) -> None:
        self.scheduler = scheduler
        self.requests = requests
        self.choices = choices

    def failed(self, batch: ScheduledBatch) -> None:
        """`batch`'s step raised (call it in the except block: it logs the traceback under the
        request ids). Fail the request at fault when it is known; otherwise rewind the step's
        requests and suspect them all."""
        requests = {seq.request.request_id: seq.request for seq in batch.sequences()}
        suspects = [r for r in requests.values() if r.request_id in self.scheduler.suspects]
        # Who else may be at fault beside a suspect: a request with no token through a step yet (one
        # that arrived after the suspects were named); the others have passed steps since.
        untried = [r for r in requests.values() if r not in suspects and r.sequences[0].num_output == 0]
        if len(requests) == 1:
            culprits = list(requests.values())
        elif len(suspects) == 1 and not untried:  # the scheduler lets at most one suspect into a step
            culprits = suspects
        else:
            culprits = []
        ids = ", ".join(r.log_id for r in requests.values())
        if culprits:
            log.exception("engine step failed; failing request %s (its step held: %s)", culprits[0].log_id, ids,
                          extra=request_extra(culprits[0].log_id))
        else:
            log.exception("engine step failed; retrying its requests (%s) one suspect at a time", ids)
        for request in culprits:
            self.requests.end(request, FinishReason.ERROR)
        for request_id, request in requests.items():
            if not culprits:
                self.scheduler.suspects.add(request_id)
                self._rewind(request)
            elif request is not culprits[0]:
                self._rewind(request)

    def passed(self, sampled: list[Sequence]) -> None:
        """A step went through: the suspects among the requests that got a token are cleared."""
        if self.scheduler.suspects:
            self.scheduler.suspects.difference_update(seq.request.request_id for seq in sampled)

    def _rewind(self, request: Request) -> None:
        """Undo what a failed step may have half done to `request`: a request whose choices have
        started is recomputed from its tokens (as after a preemption) and gets the events the
        step produced for it; one whose first token was not sampled starts over."""
        if request.request_id not in self.requests:  # finished and told before the failure
            return
        if request.sequences[0].num_output == 0:  # nothing of it was sent but maybe a PromptEvent, in the outbox
            for seq in request.sequences:
                self.scheduler.release(seq)
            request.outbox = []
            self.scheduler.waiting.extendleft(reversed(self.choices.make(request)))
            return
        for seq in request.sequences:
            if not seq.finished:
                self.scheduler.preempt(seq)
        self.requests.send(request)
