"""The engine loop: step() = scheduler.schedule() -> runner.run() -> postprocess(), returning the
step's outputs: for each request that has news, its events (the prompt, new text, finals).

It runs on its own thread. Other threads submit requests and aborts through its inbox (inbox.py); the
loop hands each step's outputs to their requests' sinks (deliver()), as often as the stream
interval says (pacing.py). The rest is in objects named for their jobs: the checks at submit
(admission.py), a request's n choices and their forks (choices.py), the requests in flight and
the events each is told (requests.py), what a failed step does (recovery.py: only the request at
fault fails), echo's prompt logprobs (prompt_logprobs.py), the metrics and the load a router
reads (metrics.py), and the KV cache's size (model/kv_cache.py).

Draining (drain()) stops admitting, finishes what runs and waits by a deadline, then cuts
what is left (FinishReason.SHUTDOWN: UNAVAILABLE) and returns from run().
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from conduit.common.logs import request_extra
from engine_service.core import prompt_logprobs
from engine_service.core.admission import Admission
from engine_service.core.block_manager import BlockManager
from engine_service.core.choices import Choices
from engine_service.core.config import EngineConfig
from engine_service.core.events import FinishReason
from engine_service.core.inbox import Inbox
from engine_service.core.metrics import EngineMetrics, Load, StepRecorder
from engine_service.core.pacing import StreamPacing
from engine_service.core.recovery import StepRecovery
from engine_service.core.requests import RequestOutput, Requests
from engine_service.core.sampler import sample
from engine_service.core.scheduler import ScheduledBatch, Scheduler
from engine_service.core.sequence import Request, Sequence
from engine_service.model.kv_cache import kv_cache_blocks
from engine_service.model.loader import LoadedModel
from engine_service.model.runner import ModelRunner, StepLogits
from engine_service.text import reasoning
from engine_service.text.constraints import GrammarCompiler
from engine_service.text.detokenizer import TokenTable

log = logging.getLogger(__name__)



class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, metrics: EngineMetrics | None = None) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.token_table = TokenTable(loaded.tokenizer)
        self.vocab_size = int(loaded.model.config.vocab_size)
        self.grammars = GrammarCompiler(loaded.tokenizer, self.vocab_size)
        fmt = reasoning.choose(config.reasoning_parser, loaded.tokenizer.chat_template)
        # A reasoning model's markers, for its chat requests (None: a model that does not reason).
        self.reasoning = reasoning.ReasoningTokens.of(fmt, loaded.tokenizer) if fmt is not None else None
        self.max_model_len = min(config.max_model_len or loaded.max_context_length, loaded.max_context_length)
        num_blocks = kv_cache_blocks(loaded.model.config, loaded.dtype, config.block_size, self.max_model_len,
                                     config.kv_cache_tokens, config.kv_cache_gb)
        kv_capacity_tokens = (num_blocks - 1) * config.block_size
        self.runner = ModelRunner(loaded.model, loaded.device, loaded.dtype, config.block_size, num_blocks,
                                  self.max_model_len, config.quantization, config.deterministic,
                                  native_kernels=config.native_kernels)
        blocks = BlockManager(num_blocks - 1,  # the runner keeps the last block for padding
                              config.block_size, self.runner.cache.copy_block, config.enable_prefix_caching)
        self.scheduler = Scheduler(blocks, config.max_batch_size, config.max_step_tokens)
        self.admission = Admission(self.max_model_len, kv_capacity_tokens, self.vocab_size, config.max_batch_size)
        self.inbox = Inbox(config.max_waiting)
        self.pacing = StreamPacing(config.stream_interval)
        self.recorder = StepRecorder(metrics)
        self.requests = Requests(self.scheduler, self.recorder)
        self.choices = Choices(loaded.tokenizer, loaded.eos_token_ids, self.grammars, self.scheduler,
                               self.requests, self.recorder)
        self.recovery = StepRecovery(self.scheduler, self.requests, self.choices)
        self.load = Load(0, 0, 0.0)  # as of the last step (or idle wake)
        self._stopping = False
        self._thread: threading.Thread | None = None
        if metrics is not None:
            metrics.cache_config(config.block_size, num_blocks - 1, config.enable_prefix_caching)
        # Where the loop hands each step's outputs: deliver() calls the sinks on the loop's thread; a
        # server may take them to its own thread in one hop per step (serving/server.py).
        self.on_outputs: Callable[[list[RequestOutput]], None] = self.deliver
        log.info("KV cache: %d blocks of %d tokens (%d tokens), max batch %d, max model len %d",
                 num_blocks, config.block_size, kv_capacity_tokens, config.max_batch_size, self.max_model_len)
        kernel = f" ({self.runner.int8_kernel} kernel)" if self.runner.quantization == "int8" else ""
        log.info("weights: %s%s on %s (%s)%s", self.runner.quantization, kernel, loaded.device,
                 str(loaded.dtype).removeprefix("torch."),
                 ", deterministic" if config.deterministic else "")
        log.info("decode attention: %s", "native, in place in the paged cache"
                 if self.runner.decode_attention is not None else "gathered, then SDPA")
        log.info("streaming: %s", self.pacing.describe())
        if fmt is not None:
            log.info("reasoning: %s (%s...%s)", fmt.name, fmt.start, fmt.end)

    # ------------------------------------------------------------ threads

    def run(self) -> None:
        """Run the loop in the calling thread until stop(), or until a drain is over. Prefer the
        main thread: torch's CPU kernels ran about 35% slower per step on a secondary thread here."""
        while True:
            draining = self.inbox.draining  # read first: what was admitted before the drain is in the inbox
            self._take_inbox()
            if self._stopping or (draining and (not self.scheduler.has_work() or self.inbox.past_deadline())):
                break
            if not self.scheduler.has_work():
                self.on_outputs(self.requests.take_outputs())  # aborts of queued requests
                self._publish(None)
                self.inbox.wait(1.0)
                continue
            started = time.perf_counter()
            try:
                outputs = self.step()
            except Exception:  # outside a step's batch (step() handles those): fail all, not loop on it
                log.exception("engine loop failed outside a step; failing every queued and running request")
                for request in self.requests.all():
                    if request.sequences:
                        self.requests.end(request, FinishReason.ERROR)
                outputs = self.requests.take_outputs()
            self.on_outputs(outputs)
            self._publish(time.perf_counter() - started)
        self._close()
        self.on_outputs(self.requests.take_outputs())

    @staticmethod
    def deliver(outputs: list[RequestOutput]) -> None:
        """Each request's events to its sink."""
        for output in outputs:
            output.request.sink(output.events)

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
        self.inbox.close()  # submit() refuses from now on; what it still held is in self.requests too
        left = self.requests.all()
        if left:
            log.warning("engine stopping with %d request(s) unfinished; ending them with UNAVAILABLE", len(left))
        for request in left:  # those still in `inbox` have no sequences yet: end() copes
            log.warning("request cut by shutdown", extra=request_extra(request.log_id))
            self.requests.end(request, FinishReason.SHUTDOWN)
        self._publish(None)

    def submit(self, request: Request) -> None:
        """Queue a request (any thread). Raises InvalidRequest, QueueFull or Draining at once."""
        self.admission.check(request)
        request.arrival = time.monotonic()
        request.log_id = request.log_id or request.request_id
        # Held under the inbox's lock, so a drain cannot slip in between.
        self.inbox.put(request, len(self.scheduler.waiting), self.scheduler.free_slots(),
                       lambda: self.requests.add(request))

    def abort(self, request_id: str) -> None:
        """Stop a request (any thread); its blocks are freed at the next step."""
        self.inbox.abort(request_id)

    def _take_inbox(self) -> None:
        """New requests join the waiting line (their leaders: forks wait on them); one that cannot be
        started fails alone; aborts end theirs."""
        requests, aborts = self.inbox.take()
        for request in requests:
            try:
                leader = self.choices.make(request)  # its sequences, stop handling, grammar matchers
            except Exception:  # that request's fault, or the engine's on it: it fails alone (INTERNAL)
                log.exception("could not start the request; failing it", extra=request_extra(request.log_id))
                self.requests.end(request, FinishReason.ERROR)
                continue
            self.scheduler.waiting.append(leader)
        for request_id in aborts:
            request = self.requests.get(request_id)
            if request is not None:
                self.requests.end(request, FinishReason.CANCELLED)

    def _publish(self, step_seconds: float | None) -> None:
        # One assignment: the gRPC server's thread reads it whole (GetLoad, for routers).
        self.load = Load.of(self.scheduler, queued=len(self.inbox))
        blocks = self.scheduler.blocks
        self.recorder.publish(step_seconds, self.load, self.scheduler.num_preemptions, blocks.queries, blocks.hits)

    # --------------------------------------------------------------- step

    def step(self) -> list[RequestOutput]:
        """One step of the running batch; returns the outputs of the requests that have news
        (with those of aborts since the last step). What was submitted meanwhile joins first."""
        self._take_inbox()
        batch = self.scheduler.schedule()
        if batch:
            try:
                logits = self.runner.run(batch, prompt_logprobs.wanted(batch))
                self.scheduler.advance(batch)
                sampled = self._postprocess(batch, logits)
            except Exception:
                self.recovery.failed(batch)
            else:
                self.recovery.passed(sampled)
        return self.requests.take_outputs()

    def _postprocess(self, batch: ScheduledBatch, logits: StepLogits) -> list[Sequence]:
        """Sample the next token of every sequence that has one due, then send each request its
        events. Returns the sequences that got a token."""
        prompt_logprobs.collect(batch, logits)
        scheduled = {seq.seq_id: seq for seq in batch.sequences()}
        rows: list[torch.Tensor] = []
        seqs: list[Sequence] = []
        for seq_id, row in logits.next_token.items():
            seq = scheduled[seq_id]
            choices = self.choices.start(seq) if seq.num_output == 0 and seq.index == 0 else [seq]
            rows += [row] * len(choices)
            seqs += choices
        if seqs:
            tokens, logprobs = sample(torch.stack(rows), seqs)
            for seq, token, logprob in zip(seqs, tokens, logprobs):
                seq.token_ids.append(token)
                reason = seq.output.add(token, logprob)
                if reason is not None:
                    self.requests.finish(seq, reason)
            self.recorder.tokens(seqs)
        stepped = {scheduled[seq_id].request.request_id: scheduled[seq_id].request
                   for seq_id in logits.next_token}
        for request in self.pacing.due(list(stepped.values())):
            self.requests.send(request)
        return seqs
