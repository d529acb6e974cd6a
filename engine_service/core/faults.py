"""Fault injection, for tests of failure handling on real processes: a model runner wrapper whose
step fails (after the forward pass) when it holds a request whose prompt contains a marker, a
wrapper of the engine's Choices whose making of a request's sequences (as the engine takes it from
its inbox) fails for a prompt that contains another, and a tokenizer wrapper that holds the
tokenization of a marked text until the test releases it. Installed only when FAULT_INJECT_ENV,
FAULT_INJECT_TAKE_ENV or TOKENIZE_HOLD_ENV is set (engine_service/__main__.py); never set them in
production. The engine knows nothing of them: the fault looks like any other."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tests' launchers import the names here without torch
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

    def run(self, step: StepInput, give_way: Callable[[], bool] | None = None) -> StepLogits:
        logits = self.runner.run(step, give_way)
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

    def make(self, request: Request) -> list[Sequence]:
        if self.marker in self.decode(request.prompt_ids):
            raise InjectedFault(f"injected fault ({FAULT_INJECT_TAKE_ENV}) for request {request.log_id}")
        return self.choices.make(request)

    def __getattr__(self, name: str):
        return getattr(self.choices, name)


TOKENIZE_HOLD_ENV = "CONDUIT_FAULT_HOLD_TOKENIZE"
HOLD_MARKER = "hold-tokenize-marker"
HOLD_LIMIT_S = 120.0  # a test that never releases does not hang its engine for good


class TokenizeHold:
    """`tokenizer`, except that tokenizing a text holding HOLD_MARKER stops in the calling thread:
    it creates the file `held` in the folder `gate`, waits until the test creates `release` there
    (at most HOLD_LIMIT_S), removes both and goes on. So a test can hold a request's tokenization
    as long as it likes and see what else the engine does meanwhile. One hold at a time."""

    def __init__(self, tokenizer, gate: Path) -> None:
        self.tokenizer = tokenizer
        self.gate = gate

    def __call__(self, text, *args, **kwargs):
        if isinstance(text, str) and HOLD_MARKER in text:
            held, release = self.gate / "held", self.gate / "release"
            release.unlink(missing_ok=True)  # a release left from an earlier hold
            held.touch()
            deadline = time.monotonic() + HOLD_LIMIT_S
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)  # time.sleep: the hold blocks whatever thread tokenizes, as real work does
            release.unlink(missing_ok=True)
            held.unlink(missing_ok=True)
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)  # the chat template, decode, the vocabulary: the tokenizer's own
