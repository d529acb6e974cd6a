"""The engine loop: step() = scheduler.schedule() -> runner.run() -> postprocess(), returning the
step's outputs: for each request that has news, its events (the prompt, new text, finals).

It runs on its own thread. Other threads submit requests and aborts through its inbox (inbox.py); the
loop hands each step's outputs to their requests' sinks (deliver()), as often as the stream
interval says (pacing.py).

A step that raises fails only the request at fault, when it can tell which: a step of one
request fails that request; otherwise the step's requests are rewound (their cache is
recomputed, as after a preemption) and become suspects, which later steps hold at most one of
at a time, so the next failure names one request. Requests failed so end with
FinishReason.ERROR (INTERNAL), with the traceback in the log under their id. A fault that does
not come back costs only the recomputation.

Draining (drain()) stops admitting, finishes what runs and waits by a deadline, then cuts
what is left (FinishReason.SHUTDOWN: UNAVAILABLE) and returns from run().
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine_service.text.constraints import GrammarCompiler
from engine_service.text.detokenizer import TokenTable
from engine_service.core.admission import Admission
from engine_service.core.inbox import Inbox
from engine_service.core.pacing import StreamPacing
from engine_service.core.block_manager import BlockManager
from engine_service.model.kv_cache import KVCache
from engine_service.model.loader import LoadedModel
from engine_service.model.runner import ModelRunner, StepLogits
from engine_service.text.output import OutputProcessor
from engine_service.core.metrics import EngineMetrics, StepRecorder
from engine_service.core.params import InvalidRequest, RequestParams
from engine_service.core.sampler import sample, token_logprob
from engine_service.core.scheduler import ScheduledBatch, Scheduler
from engine_service.core.events import Event, FinalEvent, FinishReason, PromptEvent, TokenLogprob
from engine_service.core.sequence import Request, Sequence
from conduit.common.logs import request_extra

log = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """A request's events from one step (or an abort, a drain's end), in order."""

    request: Request
    events: list[Event]


@dataclass
class EngineConfig:
    max_batch_size: int = 32
    max_waiting: int = 256
    max_step_tokens: int = 512  # decode tokens + prompt-chunk tokens per step
    block_size: int = 16
    kv_cache_tokens: int = 0  # 0: sized from kv_cache_gb
    kv_cache_gb: float = 2.0
    max_model_len: int = 0  # 0: the model's context length
    enable_prefix_caching: bool = True  # share cached full prompt blocks across requests (block_manager.py)
    quantization: str | None = None  # linear weights: none, int8, int4; None: the default (model/linear.py)
    deterministic: bool = False  # a sequence's results never depend on the batch it runs in
    native_kernels: bool = True  # int8 linears and decode attention on model/native.py's kernels where they build
    # Steps whose tokens a request gathers before they are sent; 0: auto (core/pacing.py).
    stream_interval: int = 0


@dataclass(frozen=True)
class Load:
    """What a router weighs: requests running and waiting, and the KV cache's used fraction."""

    running: int
    waiting: int
    kv_usage: float


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, metrics: EngineMetrics | None = None) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.token_table = TokenTable(loaded.tokenizer)
        self.vocab_size = int(loaded.model.config.vocab_size)
        self.grammars = GrammarCompiler(loaded.tokenizer, self.vocab_size)
        self.max_model_len = min(config.max_model_len or loaded.max_context_length, loaded.max_context_length)
        num_blocks = self._num_blocks()
        self.kv_capacity_tokens = (num_blocks - 1) * config.block_size
        self.runner = ModelRunner(loaded.model, loaded.device, loaded.dtype, config.block_size, num_blocks,
                                  self.max_model_len, config.quantization, config.deterministic,
                                  native_kernels=config.native_kernels)
        blocks = BlockManager(num_blocks - 1,  # the runner keeps the last block for padding
                              config.block_size, self.runner.cache.copy_block, config.enable_prefix_caching)
        self.scheduler = Scheduler(blocks, config.max_batch_size, config.max_step_tokens)
        self.admission = Admission(self.max_model_len, self.kv_capacity_tokens, self.vocab_size, config.max_batch_size)
        self.inbox = Inbox(config.max_waiting)
        self._requests: dict[str, Request] = {}  # every request submitted and not yet finished
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.recorder = StepRecorder(metrics)
        self.load = Load(0, 0, 0.0)  # as of the last step (or idle wake)
        if metrics is not None:
            metrics.cache_config(config.block_size, num_blocks - 1, config.enable_prefix_caching)
        self.pacing = StreamPacing(config.stream_interval)
        self._outputs: list[RequestOutput] = []  # what the loop delivers next (step() returns them)
        # Where the loop hands each step's outputs: deliver() calls the sinks on the loop's thread; a
        # server may take them to its own thread in one hop per step (serving/server.py).
        self.on_outputs: Callable[[list[RequestOutput]], None] = self.deliver
        log.info("KV cache: %d blocks of %d tokens (%d tokens), max batch %d, max model len %d",
                 num_blocks, config.block_size, self.kv_capacity_tokens, config.max_batch_size, self.max_model_len)
        kernel = f" ({self.runner.int8_kernel} kernel)" if self.runner.quantization == "int8" else ""
        log.info("weights: %s%s on %s (%s)%s", self.runner.quantization, kernel, loaded.device,
                 str(loaded.dtype).removeprefix("torch."),
                 ", deterministic" if config.deterministic else "")
        log.info("decode attention: %s", "native, in place in the paged cache"
                 if self.runner.decode_attention is not None else "gathered, then SDPA")
        log.info("streaming: %s", self.pacing.describe())

    def _num_blocks(self) -> int:
        cfg, model_cfg = self.config, self.loaded.model.config
        tokens = cfg.kv_cache_tokens
        if not tokens:
            head_dim = getattr(model_cfg, "head_dim", None) or model_cfg.hidden_size // model_cfg.num_attention_heads
            per_token = KVCache.bytes_per_token(model_cfg.num_hidden_layers, model_cfg.num_key_value_heads,
                                                head_dim, self.loaded.dtype)
            tokens = int(cfg.kv_cache_gb * (1 << 30)) // per_token
        # Always room for at least one full-length sequence.
        tokens = max(tokens, self.max_model_len + cfg.block_size)
        return -(-tokens // cfg.block_size) + 1  # + the runner's padding block

    # ------------------------------------------------------------ threads

    def run(self) -> None:
        """Run the loop in the calling thread until stop(), or until a drain is over. Prefer the
        main thread: torch's CPU kernels ran about 35% slower per step on a secondary thread here."""
        while True:
            draining = self.inbox.draining  # read first: what was admitted before the drain is in the inbox
            self._drain_inbox()
            if self._stopping or (draining and (not self.scheduler.has_work() or self.inbox.past_deadline())):
                break
            if not self.scheduler.has_work():
                self.on_outputs(self._take_outputs())  # aborts of queued requests
                self._update_metrics(None)
                self.inbox.wait(1.0)
                continue
            started = time.perf_counter()
            try:
                outputs = self.step()
            except Exception:  # outside a step's batch (step() handles those): fail all, not loop on it
                log.exception("engine loop failed outside a step; failing every queued and running request")
                for request in list(self._requests.values()):
                    if request.sequences:
                        self._finish_request(request, FinishReason.ERROR)
                outputs = self._take_outputs()
            self.on_outputs(outputs)
            self._update_metrics(time.perf_counter() - started)
        self._close()
        self.on_outputs(self._take_outputs())

    @staticmethod
    def deliver(outputs: list[RequestOutput]) -> None:
        """Each request's events to its sink."""
        for output in outputs:
            output.request.sink(output.events)

    def _take_outputs(self) -> list[RequestOutput]:
        outputs, self._outputs = self._outputs, []
        return outputs

    def start(self) -> None:
        """Run the loop on a background thread (for embedding the engine in another program)."""
        self._thread = threading.Thread(target=self.run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop now; requests still there end with FinishReason.SHUTDOWN. Waits for a
        background loop. Not for signal handlers (it takes a lock): see drain()."""
        self._stopping = True
        self.inbox.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def drain(self, deadline: float) -> None:
        """Refuse new requests (Draining) from now on, finish the queued and running ones, and
        make run() return when they are done, or at `deadline` (time.monotonic()) with the rest
        ended by FinishReason.SHUTDOWN. A later call may bring the deadline forward. Any thread
        but a signal handler's."""
        self.inbox.drain(deadline)

    @property
    def draining(self) -> bool:
        return self.inbox.draining

    def _close(self) -> None:
        """The loop is over: end every request still here with SHUTDOWN."""
        self.inbox.close()  # submit() refuses from now on; what it still held is in self._requests too
        left = list(self._requests.values())
        if left:
            log.warning("engine stopping with %d request(s) unfinished; ending them with UNAVAILABLE", len(left))
        for request in left:  # those still in `inbox` have no sequences yet: _finish_request copes
            log.warning("request cut by shutdown", extra=request_extra(request.log_id))
            self._finish_request(request, FinishReason.SHUTDOWN)
        self._update_metrics(None)

    def submit(self, request: Request) -> None:
        """Queue a request (any thread). Raises InvalidRequest, QueueFull or Draining at once."""
        self.admission.check(request)
        request.arrival = time.monotonic()
        request.log_id = request.log_id or request.request_id

        def admit() -> None:
            if request.request_id in self._requests:
                raise InvalidRequest(f"request_id {request.request_id!r} is already running", "request_id")
            self._requests[request.request_id] = request

        self.inbox.put(request, len(self.scheduler.waiting), admit)

    def abort(self, request_id: str) -> None:
        """Stop a request (any thread); its blocks are freed at the next step."""
        self.inbox.abort(request_id)

    def stop_ids_for(self, params: RequestParams) -> set[int]:
        ids = set(params.stopping.stop_token_ids)
        if not params.stopping.ignore_eos:
            ids.update(self.loaded.eos_token_ids)
        return ids

    def _new_sequence(self, request: Request, index: int) -> Sequence:
        stop_ids = self.stop_ids_for(request.params)
        matcher = None
        if request.grammar is not None:
            # Tool calls (forced, or on auto beside an answer format) end where the model would leave them.
            matcher = self.grammars.matcher(request.grammar, end_on_exit=request.tools is not None,
                                            answer=request.answer_grammar)
        stopping = request.params.stopping
        output = OutputProcessor(index=index, prompt_ids=request.prompt_ids, tokenizer=self.tokenizer,
                                 stop_ids=stop_ids, eos_ids=self.loaded.eos_token_ids, stop_strings=stopping.stop,
                                 min_tokens=stopping.min_tokens, max_tokens=request.max_tokens,
                                 tools=request.tools, matcher=matcher)
        return Sequence(request, index, stop_ids, matcher, output)

    def _drain_inbox(self) -> None:
        inbox, aborts = self.inbox.take()
        for request in inbox:
            request.sequences = [self._new_sequence(request, i) for i in range(request.params.n)]
            leader = request.sequences[0]
            leader.forks = request.sequences[1:]  # siblings join once the shared prompt is prefilled
            self.scheduler.waiting.append(leader)
        for request_id in aborts:
            request = self._requests.get(request_id)
            if request is not None:
                self._finish_request(request, FinishReason.CANCELLED)

    # --------------------------------------------------------------- step

    def step(self) -> list[RequestOutput]:
        """One step of the running batch; returns the outputs of the requests that have news
        (with those of aborts since the last step). What was submitted meanwhile joins first."""
        self._drain_inbox()
        batch = self.scheduler.schedule()
        if not batch:
            return self._take_outputs()
        try:
            logits = self.runner.run(batch, self._wanting_prompt_logprobs(batch))
            self.scheduler.advance(batch)
            sampled = self._postprocess(batch, logits)
        except Exception:
            self._step_failed(batch)
            return self._take_outputs()
        if self.scheduler.suspects:  # a suspect that got a token through is cleared
            self.scheduler.suspects.difference_update(seq.request.request_id for seq in sampled)
        return self._take_outputs()

    def _step_failed(self, batch: ScheduledBatch) -> None:
        """Fail the request at fault when it is known; otherwise rewind the step's requests and
        suspect them all (see the module docstring). Logs the traceback under the request ids."""
        requests = {seq.request.request_id: seq.request for seq in batch.sequences()}
        suspects = [r for r in requests.values() if r.request_id in self.scheduler.suspects]
        if len(requests) == 1:
            culprits = list(requests.values())
        elif len(suspects) == 1:  # the scheduler lets at most one suspect into a step
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
            self._finish_request(request, FinishReason.ERROR)
        for request_id, request in requests.items():
            if not culprits:
                self.scheduler.suspects.add(request_id)
                self._rewind(request)
            elif request is not culprits[0]:
                self._rewind(request)

    def _rewind(self, request: Request) -> None:
        """Undo what a failed step may have half done to `request`: a request whose choices have
        started is recomputed from its tokens (as after a preemption) and gets the events the
        step produced for it; one whose first token was not sampled starts over."""
        if request.request_id not in self._requests:  # finished and told before the failure
            return
        leader = request.sequences[0]
        if leader.num_output == 0:  # nothing of it was sent but maybe a PromptEvent, still in the outbox
            for seq in request.sequences:
                self.scheduler.release(seq)
            request.outbox = []
            request.sequences = [self._new_sequence(request, i) for i in range(request.params.n)]
            leader = request.sequences[0]
            leader.forks = request.sequences[1:]
            self.scheduler.waiting.appendleft(leader)
            return
        for seq in request.sequences:
            if not seq.finished:
                self.scheduler.preempt(seq)
        self._send_events(request)

    @staticmethod
    def _wanting_prompt_logprobs(batch: ScheduledBatch) -> set[int]:
        """Sequences whose prompt chunk needs every logits row (echo with logprobs; once per request)."""
        return {seq.seq_id for seq, _ in batch.prefill
                if seq.params.wants_prompt_logprobs and seq.index == 0 and seq.num_output == 0}

    def _postprocess(self, batch: ScheduledBatch, logits: StepLogits) -> list[Sequence]:
        """Sample the next token of every sequence that has one due, then send each request its
        events. Returns the sequences that got a token."""
        self._collect_prompt_logprobs(logits, batch)
        scheduled = {seq.seq_id: seq for seq in batch.decode} | {seq.seq_id: seq for seq, _ in batch.prefill}
        rows: list[torch.Tensor] = []
        seqs: list[Sequence] = []
        for seq_id, row in logits.next_token.items():
            seq = scheduled[seq_id]
            choices = self._start_choices(seq) if seq.num_output == 0 and seq.index == 0 else [seq]
            rows += [row] * len(choices)
            seqs += choices
        if seqs:
            tokens, logprobs = sample(torch.stack(rows), seqs)
            for seq, token, logprob in zip(seqs, tokens, logprobs):
                self._append_token(seq, token, logprob)
            self.recorder.tokens(seqs)
        stepped = {scheduled[seq_id].request.request_id: scheduled[seq_id].request
                   for seq_id in logits.next_token}
        for request in self.pacing.due(list(stepped.values())):
            self._send_events(request)
        return seqs

    def _collect_prompt_logprobs(self, logits: StepLogits, batch: ScheduledBatch) -> None:
        """Echo with logprobs: the logprob of each prompt token given the ones before it."""
        for seq, _ in batch.prefill:
            if seq.seq_id not in logits.prompt:
                continue
            first, rows = logits.prompt[seq.seq_id]
            if len(seq.prompt_logprobs) != first + 1:  # already collected before a preemption
                continue
            targets = seq.token_ids[first + 1:min(first + 1 + rows.shape[0], seq.prompt_len)]
            if not targets:
                continue
            logp = torch.log_softmax(rows[:len(targets)], dim=-1)
            for i, target in enumerate(targets):
                seq.prompt_logprobs.append(token_logprob(logp[i], target, seq.params.top_logprobs))

    def _start_choices(self, leader: Sequence) -> list[Sequence]:
        """The prompt is prefilled: announce it, and start the request's choices from it (n > 1 forks
        share its blocks). Returns the choices that sample a first token now."""
        request = leader.request
        request.outbox.append(PromptEvent(
            prompt_ids=list(request.prompt_ids),
            prompt_logprobs=leader.prompt_logprobs if leader.params.wants_prompt_logprobs else None,
            cached_tokens=request.cached_tokens or 0))
        self.recorder.prompt_done(len(request.prompt_ids))
        forks, leader.forks = leader.forks, []
        if request.max_tokens == 0:  # echo-only scoring: the prompt was all we needed
            for choice in [leader, *forks]:
                self._finish(choice, FinishReason.LENGTH)
            return []
        for fork in forks:
            self.scheduler.add_fork(leader, fork)
        return [*forks, leader]

    def _send_events(self, request: Request) -> None:
        events, request.outbox = request.outbox, []
        request.unsent_steps = 0
        for seq in request.sequences:
            chunk = seq.output.chunk()
            if chunk is not None:
                events.append(chunk)
            if seq.finished and not seq.finish_reason.abnormal and not seq.final_sent:
                seq.final_sent = True
                events.append(FinalEvent(seq.index, seq.finish_reason, seq.prompt_len, seq.num_output,
                                         seq.output.matched_stop, tool_calls=seq.output.tool_calls))
        if request.finished:
            self._forget(request)
        if events:
            self._outputs.append(RequestOutput(request, events))

    def _append_token(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> None:
        seq.token_ids.append(token)
        reason = seq.output.add(token, logprob)
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        self.scheduler.release(seq)
        self.recorder.finished(reason.value, seq.request.arrival)

    def _finish_request(self, request: Request, reason: FinishReason) -> None:
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
        self.recorder.finished(reason.value, request.arrival, unfinished)
        self._forget(request)
        finals = [FinalEvent(s.index, reason, s.prompt_len, s.num_output) for s in request.sequences]
        self._outputs.append(RequestOutput(request, finals or [FinalEvent(i, reason, len(request.prompt_ids), 0)
                                                               for i in range(request.params.n)]))

    def _forget(self, request: Request) -> None:
        self._requests.pop(request.request_id, None)
        self.scheduler.suspects.discard(request.request_id)

    def _update_metrics(self, step_seconds: float | None) -> None:
        running = {seq.request.request_id for seq in self.scheduler.running}
        waiting = {seq.request.request_id for seq in self.scheduler.waiting} - running
        blocks = self.scheduler.blocks
        # One assignment: the gRPC server's thread reads it whole (GetLoad, for routers).
        self.load = Load(len(running), len(waiting) + len(self.inbox), 1.0 - blocks.num_free / blocks.num_blocks)
        if self.recorder.metrics is None:
            return
        self.recorder.publish(step_seconds, self.load.running, self.load.waiting, self.load.kv_usage,
                              self.scheduler.num_preemptions, blocks.queries, blocks.hits)

