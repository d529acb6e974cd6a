"""Fault injection, for tests of failure handling on real processes: a model runner wrapper whose
step fails (after the forward pass) when it holds a request whose prompt contains a marker, and a
wrapper of the engine's Choices whose making of a request's sequences (as the engine takes it from
its inbox) fails for a prompt that contains another. Installed only when FAULT_INJECT_ENV or
FAULT_INJECT_TAKE_ENV is set (engine_service/__main__.py); never set them in production. The
engine knows nothing of them: the fault looks like any other."""

from __future__ import annotations

from collections.abc import Callable

from engine_service.core.choices import Choices
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence
from engine_service.model.runner import ModelRunner
from engine_service.model.step import StepInput, StepLogits

FAULT_INJECT_ENV = "CONDUIT_FAULT_INJECT_PROMPT"
FAULT_INJECT_TAKE_ENV = "CONDUIT_FAULT_INJECT_TAKE_PROMPT"


class InjectedFault(RuntimeError):
    """Raised by a step that holds a request marked for fault injection (FAULT_INJECT_ENV)."""


class FaultInjectingRunner:
    """`runner`, except that a step holding a prompt with `marker` (as `decode` reads it) raises. The
    step names its sequences only; `scheduler` has them running (with their requests)."""

    def __init__(self, runner: ModelRunner, marker: str, decode: Callable[[list[int]], str],
                 scheduler: Scheduler) -> None:
        self.runner = runner
        self.marker = marker
        self.decode = decode
        self.scheduler = scheduler

    def run(self, step: StepInput) -> StepLogits:
        logits = self.runner.run(step)
        stepped = {row.seq_id for row in step.decode} | {chunk.seq_id for chunk in step.prefill}
        requests = {seq.request.request_id: seq.request for seq in self.scheduler.running if seq.seq_id in stepped}
        marked = sorted(r.log_id for r in requests.values() if self.marker in self.decode(r.prompt_ids))
        if marked:
            raise InjectedFault(f"injected fault ({FAULT_INJECT_ENV}) for request(s) {', '.join(marked)}")
        return logits

    def __getattr__(self, name: str):
        return getattr(self.runner, name)  # the cache, the kernels' choices: the runner's own


class FaultInjectingChoices:
    """`choices`, except that making the sequences of a request whose prompt holds `marker` raises,
    as a grammar matcher or a detokenizer that cannot be built for it would."""

    def __init__(self, choices: Choices, marker: str, decode: Callable[[list[int]], str]) -> None:
        self.choices = choices
        self.marker = marker
        self.decode = decode

    def make(self, request: Request) -> Sequence:
        if self.marker in self.decode(request.prompt_ids):
            raise InjectedFault(f"injected fault ({FAULT_INJECT_TAKE_ENV}) for request {request.log_id}")
        return self.choices.make(request)

    def __getattr__(self, name: str):
        return getattr(self.choices, name)
