"""The step, and nothing else: step() = scheduler.schedule() -> runner.run() -> postprocess(),
returning the step's outputs: for each request that has news, its events (the prompt, new text,
finals). vLLM's EngineCore; the busy loop that feeds it and hands its outputs on is engine_loop.py.

A step of batch work alone (the Batch API's, with `batch_apart`) gives way to an interactive arrival: the
runner stops it between two layers (model/step.py's StepGaveWay) and it runs again from the start, so a
live request's first token waits for one layer of it, not the whole step. Nothing of it counts until
it ends: the scheduler advances only what ran whole.

It runs on the loop's thread only. The rest is in objects named for their jobs: a request's n
choices and their forks (choices.py), the requests in flight and the events each is told
(requests.py), what a failed step does (recovery.py: only the request at fault fails), echo's
prompt logprobs (prompt_logprobs.py), how often a request is told (pacing.py), the metrics
(metrics.py). engine.py builds them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from conduit_common.logs import request_extra
from engine_service.core import prompt_logprobs
from engine_service.core.choices import Choices
from engine_service.core.events import FinishReason
from engine_service.core.metrics import StepRecorder
from engine_service.core.pacing import StreamPacing
from engine_service.core.recovery import StepRecovery
from engine_service.core.requests import RequestOutput, Requests
from engine_service.core.sampler import sample
from engine_service.core.scheduler import ScheduledBatch, Scheduler, embedding_inputs
from engine_service.core.sequence import Request, Sequence
from engine_service.core.speculation import Speculator
from engine_service.model.runner import ModelRunner
from engine_service.model.step import StepGaveWay, StepLogits

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, requests: Requests, choices: Choices,
                 recovery: StepRecovery, pacing: StreamPacing, recorder: StepRecorder,
                 speculator: Speculator | None = None) -> None:
        self.scheduler = scheduler
        self.speculator = speculator
        self.runner = runner
        self.requests = requests
        self.choices = choices
        self.recovery = recovery
        self.pacing = pacing
        self.recorder = recorder
        # Whether an interactive request has arrived (the inbox's interactive_waiting; engine.py sets it
        # where batch steps run apart): asked between a batch step's layers. None: steps run whole.
        self.batch_gives_way: Callable[[], bool] | None = None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def add_requests(self, requests: list[Request]) -> None:
        """New requests join the waiting line (their leaders: forks wait on them); one that cannot be
        started fails alone."""
        for request in requests:
            try:
                queued = self.choices.make(request)  # its sequences, stop handling, grammar matchers
            except Exception:  # that request's fault, or the engine's on it: it fails alone (INTERNAL)
                log.exception("could not start the request; failing it", extra=request_extra(request.log_id))
                self.requests.end(request, FinishReason.ERROR)
                continue
            self.scheduler.waiting.extend(queued)

    def abort_requests(self, request_ids: list[str]) -> None:
        """End each request still here with CANCELLED; its blocks go back now."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.requests.end(request, FinishReason.CANCELLED)

    def step(self) -> list[RequestOutput]:
        """One step of the running batch; returns the outputs of the requests that have news
        (with those of aborts since the last step)."""
        batch = self.scheduler.schedule()
        if batch:
            if self.speculator is not None:
                self.speculator.draft(batch)
            give_way = self.batch_gives_way if batch.only_batch_work() else None
            try:
                logits = self.runner.run(batch.step_input(prompt_logprobs.wanted(batch), embedding_inputs(batch)),
                                         give_way)
                self.scheduler.advance(batch)
                sampled = self._postprocess(batch, logits)
            except StepGaveWay:
                self.recorder.gave_way()
            except Exception:
                self.recovery.failed(batch)
            else:
                self.recovery.passed(sampled)
        return self.requests.take_outputs()

    def take_outputs(self) -> list[RequestOutput]:
        """What was told outside a step since the last call (aborts of queued requests, ends)."""
        return self.requests.take_outputs()

    def shut_down(self) -> None:
        """End every request still here with SHUTDOWN (queued, running, or submitted and not yet
        taken: those have no sequences yet, end() copes)."""
        for request in self.requests.all():
            log.warning("request cut by shutdown", extra=request_extra(request.log_id))
            self.requests.end(request, FinishReason.SHUTDOWN)

    def fail_started(self) -> None:
        """After a failure outside a step's batch (step() handles those): fail every started request,
        rather than loop on the fault."""
        for request in self.requests.all():
            if request.sequences:
                self.requests.end(request, FinishReason.ERROR)

    def _postprocess(self, batch: ScheduledBatch, logits: StepLogits) -> list[Sequence]:
        """Sample the next token of every sequence that has one due, then send each request its
        events. Returns the sequences that got a token."""
        prompt_logprobs.collect(batch, logits)
        scheduled = {seq.seq_id: seq for seq in batch.sequences()}
        rows: list[torch.Tensor] = []
        seqs: list[Sequence] = []
        for seq_id, row in logits.next_token.items():
            seq = scheduled[seq_id]
            if seq.request.embeds:  # an Embed's input: its vector, no token
                self.choices.embedded(seq, logits.hidden[seq_id])
                continue
            choices = self.choices.start(seq) if seq.num_output == 0 and seq.index == 0 else [seq]
            rows += [row] * len(choices)
            seqs += choices
        if seqs:
            self._sample(torch.stack(rows), seqs)
        if batch.drafts:
            self._take_drafts(batch, logits)
        stepped = {scheduled[seq_id].request.request_id: scheduled[seq_id].request
                   for seq_id in logits.next_token}
        for request in self.pacing.due(list(stepped.values())):
            self.requests.send(request)
        return seqs

    def _sample(self, rows: torch.Tensor, seqs: list[Sequence]) -> None:
        """A token for each sequence from its logits row, into its output."""
        tokens, logprobs = sample(rows, seqs)
        for seq, token, logprob in zip(seqs, tokens, logprobs):
            seq.token_ids.append(token)
            reason = seq.output.add(token, logprob)
            if reason is not None:
                self.requests.finish(seq, reason)
        self.recorder.tokens(seqs)

    def _take_drafts(self, batch: ScheduledBatch, logits: StepLogits) -> None:
        """Position by position, each sequence whose last sampled token is its next draft token takes
        it (its keys and values were computed in the step) and samples again from the logits after
        it, as decoding one token a step would (core/speculation.py)."""
        drafted = [seq for seq in batch.decode if seq.seq_id in batch.drafts]
        accepted = dict.fromkeys(drafted, 0)
        taking = [seq for seq in drafted if self._drafted_next(seq, batch.drafts[seq.seq_id], 0)]
        while taking:
            position = accepted[taking[0]]
            for seq in taking:
                accepted[seq] += 1
                self.scheduler.accepted(seq, 1)
            self._sample(torch.stack([logits.drafts[seq.seq_id][position] for seq in taking]), taking)
            taking = [seq for seq in taking if self._drafted_next(seq, batch.drafts[seq.seq_id], position + 1)]
        for seq in drafted:
            drafts = batch.drafts[seq.seq_id]
            refused = not seq.finished and accepted[seq] < len(drafts)
            seq.acceptance.verified(accepted[seq], refused)
        self.recorder.drafts([len(batch.drafts[seq.seq_id]) for seq in drafted], list(accepted.values()))

    @staticmethod
    def _drafted_next(seq: Sequence, drafts: list[int], position: int) -> bool:
        """Whether seq, still running, just sampled its draft token at `position`."""
        return not seq.finished and position < len(drafts) and seq.token_ids[-1] == drafts[position]
