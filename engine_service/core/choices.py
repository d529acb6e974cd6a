"""A request's n choices: their sequences, and their start once the prompt is prefilled.

Only the first choice (the leader) is scheduled at first; its siblings (forks) wait on it and join
the batch from its prefilled prompt, sharing the prompt's KV blocks (Scheduler.add_fork), so n
choices prefill their prompt once. Each choice has its own stop ids, grammar matcher and output
processing (text/output.py). The sequences are made when a request enters the scheduler, and
made again when a failed step starts a request over (recovery.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine_service.core.events import FinishReason, PromptEvent
from engine_service.core.metrics import StepRecorder
from engine_service.core.params import RequestParams
from engine_service.core.requests import Requests
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence
from engine_service.text.constraints import GrammarCompiler
from engine_service.text.output import OutputProcessor
from engine_service.text.detokenizer import skipped_markers
from engine_service.text.tool_parser import CALL_TAGS

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase


class Choices:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: list[int], grammars: GrammarCompiler,
                 scheduler: Scheduler, requests: Requests, recorder: StepRecorder) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.grammars = grammars
        self.scheduler = scheduler
        self.requests = requests
        self.recorder = recorder
        self.call_markers = skipped_markers(tokenizer, CALL_TAGS)  # tool-call tags the detokenizer skips

    def make(self, request: Request) -> list[Sequence]:
        """Fresh sequences for every choice of `request`; returns those the caller queues: the
        leader (the forks wait on it), or every input of an Embed (each its own prompt)."""
        if request.embeds:
            request.sequences = [Sequence(request, i, set(), None, None) for i in range(request.params.n)]
            return list(request.sequences)
        request.sequences = [self._sequence(request, i) for i in range(request.params.n)]
        leader = request.sequences[0]
        leader.forks = request.sequences[1:]  # siblings join once the shared prompt is prefilled
        return [leader]

    def embedded(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """An Embed's input is prefilled: its vector is its last token's hidden row, normalized (the
        last-token pooling of decoder embedding models); it ends there, its blocks freed."""
        seq.embedding = torch.nn.functional.normalize(hidden, p=2, dim=-1)
        self.recorder.prompt_done(seq.prompt_len)
        self.requests.finish(seq, FinishReason.STOP)

    def start(self, leader: Sequence) -> list[Sequence]:
        """The prompt is prefilled: announce it, and start the request's choices from it (n > 1 forks
        share its blocks). Returns the choices that sample a first token now."""
        request = leader.request
        request.outbox.append(PromptEvent(
            prompt_ids=list(request.prompt_ids),
            prompt_logprobs=leader.prompt_logprobs if leader.params.wants_prompt_logprobs else None,
            cached_tokens=request.cached_tokens or 0))
        self.recorder.prompt_done(len(request.prompt_ids), request.adapter.name if request.adapter else "")
        forks, leader.forks = leader.forks, []
        if request.max_tokens == 0:  # echo-only scoring: the prompt was all we needed
            for choice in [leader, *forks]:
                self.requests.finish(choice, FinishReason.LENGTH)
            return []
        for fork in forks:
            self.scheduler.add_fork(leader, fork)
        return [*forks, leader]

    def _sequence(self, request: Request, index: int) -> Sequence:
        stop_ids = self._stop_ids(request.params)
        matcher = None
        if request.grammar is not None:
            # Tool calls (forced, or on auto beside an answer format) end where the model would leave them.
            matcher = self.grammars.matcher(request.grammar, end_on_exit=request.tools is not None,
                                            answer=request.answer_grammar)
        stopping = request.params.stopping
        output = OutputProcessor(index=index, prompt_ids=request.prompt_ids, tokenizer=self.tokenizer,
                                 stop_ids=stop_ids, eos_ids=self.eos_ids, stop_strings=stopping.stop,
                                 min_tokens=stopping.min_tokens, max_tokens=request.max_tokens,
                                 tools=request.tools, matcher=matcher, reasoning=request.reasoning,
                                 phase=request.reasoning_phase, max_reasoning_tokens=request.max_reasoning_tokens,
                                 call_markers=self.call_markers)
        return Sequence(request, index, stop_ids, matcher, output)

    def _stop_ids(self, params: RequestParams) -> set[int]:
        ids = set(params.stopping.stop_token_ids)
        if not params.stopping.ignore_eos:
            ids.update(self.eos_ids)
        return ids
