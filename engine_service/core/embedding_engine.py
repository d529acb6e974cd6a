"""The embedding engine's loop: each step packs pending inputs into one padded forward of the
embedding model, within the step-token budget, and hands each request its vectors when its last
input is done.

Its own loop rather than the decoder scheduler's: an embedding is one prefill with no KV cache and
no sampling, so the scheduler's blocks, chunked prefill, preemption, forks and stream pacing would
all be dead weight on an encoder (which has no KV cache to page at all). What the two share is
reused as is: the inbox (admission under one lock, aborts, the drain), the metrics (StepRecorder:
running/waiting, prompt tokens, request success, e2e latency, step time) and the drain's rules.

Packing: the budget counts padded tokens (rows x the longest row), as that is what the forward
computes; at least one input runs each step however long. A request's inputs are taken in length
order (as sentence-transformers' encode sorts), so one with many inputs of mixed lengths pads little;
requests are served first come, first served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from conduit_common.logs import request_extra
from engine_service.core.config import EngineConfig
from engine_service.core.core_share import CoreShare
from engine_service.core.events import FinishReason
from engine_service.core.inbox import Inbox
from engine_service.core.metrics import EngineMetrics, Load, StepRecorder
from engine_service.model.encoder import EmbeddingModel

log = logging.getLogger(__name__)


@dataclass(eq=False)
class EmbedJob:
    """One Embed call: its inputs' token ids, and where its vectors go. `sink(vectors, reason)` is
    called once, on the loop's thread: the vectors in input order with FinishReason.STOP, or None
    and the reason it ended otherwise (ERROR, SHUTDOWN, CANCELLED)."""

    request_id: str
    inputs: list[list[int]]
    sink: Callable[[torch.Tensor | None, FinishReason], None]
    log_id: str = ""
    arrival: float = 0.0
    batch: bool = False  # batch work (EmbedRequest.priority): packed after every interactive job's inputs
    finished: bool = False
    vectors: list[torch.Tensor | None] = field(default_factory=list)
    order: deque[int] = field(default_factory=deque)  # input indexes not yet run, shortest first
    done: int = 0

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)
        self.order = deque(sorted(range(len(self.inputs)), key=lambda i: len(self.inputs[i])))

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


class EmbeddingEngine:
    """Served by serving/embed.py. Runs on the thread that calls run() (the main thread, as Engine)."""

    adapters = None  # an encoder serves no LoRA adapters (the servicers ask, as of Engine)

    def __init__(self, loaded: EmbeddingModel, config: EngineConfig, metrics: EngineMetrics | None = None) -> None:
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.vocab_size
        self.max_model_len = min(config.max_model_len or loaded.max_context_length, loaded.max_context_length)
        self.max_step_tokens = config.max_step_tokens
        self.max_rows = config.max_batch_size
        self.inbox = Inbox(config.max_waiting)
        self.recorder = StepRecorder(metrics)
        self.load = Load(0, 0, 0.0)
        self.on_outputs: Callable[[list[Callable[[], None]]], None] = self.deliver
        self._jobs: dict[str, EmbedJob] = {}  # waiting or running, in arrival order
        self._finished: list[Callable[[], None]] = []  # sink calls due at the end of this step
        self._stopping = False
        self._thread: threading.Thread | None = None
        # --core-share: where this engine marks that it has work, so a chat engine sharing the cores
        # runs on fewer threads meanwhile (core_share.py)
        self.core_share: CoreShare | None = None
        self._marked = False
        if metrics is not None:
            metrics.cache_config(0, 0, False)
        log.info("embedding engine: %d-token steps of up to %d inputs, inputs up to %d tokens",
                 self.max_step_tokens, self.max_rows, self.max_model_len)

    # ------------------------------------------------------------ threads

    def run(self) -> None:
        """The loop, until stop() or the end of a drain (see Engine.run)."""
        while True:
            draining = self.inbox.draining
            self._take_inbox()
            if self._stopping or (draining and (not self._jobs or self.inbox.past_deadline())):
                break
            if not self._jobs:
                self._send()
                self._publish(None)
                self._mark(False)
                self.inbox.wait(1.0)
                continue
            started = time.perf_counter()
            self._mark(True)
            self.step()
            self._send()
            self._publish(time.perf_counter() - started)
        self.inbox.close()
        for job in list(self._jobs.values()):
            log.warning("embedding request cut by shutdown", extra=request_extra(job.log_id))
            self._end(job, FinishReason.SHUTDOWN)
        self._send()
        self._publish(None)
        if self.core_share is not None:
            self.core_share.mark(0.0)  # gone: nothing to yield to

    def _mark(self, working: bool) -> None:
        """The mark in --core-share's file: renewed at every step, and once when the work runs out."""
        if self.core_share is None or (not working and not self._marked):
            return
        if working:
            self.core_share.working()
        else:
            self.core_share.idle()
        self._marked = working

    @staticmethod
    def deliver(calls: list[Callable[[], None]]) -> None:
        for call in calls:
            call()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="embedding-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self.inbox.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def drain(self, deadline: float) -> None:
        self.inbox.drain(deadline)

    @property
    def draining(self) -> bool:
        return self.inbox.draining

    def submit(self, job: EmbedJob) -> None:
        """Queue a job (any thread); its inputs are checked by the caller. Raises QueueFull or Draining."""
        job.arrival = time.monotonic()
        job.log_id = job.log_id or job.request_id
        self.inbox.put(job, len(self._jobs), 0, lambda: None)  # type: ignore[arg-type]

    def abort(self, request_id: str) -> None:
        self.inbox.abort(request_id)

    # --------------------------------------------------------------- step

    def _take_inbox(self) -> None:
        jobs, aborts = self.inbox.take()
        for job in jobs:
            self._jobs[job.request_id] = job  # type: ignore[attr-defined]
        for request_id in aborts:
            job = self._jobs.get(request_id)
            if job is not None:
                self._end(job, FinishReason.CANCELLED)

    def step(self) -> None:
        """One padded forward over the inputs that fit the budget."""
        rows = self._pack()
        try:
            vectors = self.loaded.embed([job.inputs[i] for job, i in rows])
        except Exception:
            log.exception("embedding step failed; failing its %d request(s)", len({id(j) for j, _ in rows}))
            for job in {id(j): j for j, _ in rows}.values():
                self._end(job, FinishReason.ERROR)
            return
        for (job, i), vector in zip(rows, vectors):
            job.vectors[i] = vector
            job.done += 1
            if job.done == len(job.inputs):
                self.recorder.prompt_done(job.prompt_tokens)
                self._end(job, FinishReason.STOP)
        log.debug("step: %d rows of up to %d tokens", len(rows), max(len(job.inputs[i]) for job, i in rows))

    def _pack(self) -> list[tuple[EmbedJob, int]]:
        """(job, input index) pairs for this step: first come first served, interactive jobs before batch
        ones, padded size in budget."""
        rows: list[tuple[EmbedJob, int]] = []
        longest = 0
        for job in sorted(self._jobs.values(), key=lambda job: job.batch):  # stable: arrival order within each
            while job.order and len(rows) < self.max_rows:
                length = len(job.inputs[job.order[0]])
                if rows and (len(rows) + 1) * max(longest, length) > self.max_step_tokens:
                    return rows
                rows.append((job, job.order.popleft()))
                longest = max(longest, length)
            if len(rows) >= self.max_rows:
                break
        return rows

    def _end(self, job: EmbedJob, reason: FinishReason) -> None:
        if job.finished:
            return
        job.finished = True
        self._jobs.pop(job.request_id, None)
        self.recorder.finished(reason.value, job.arrival)
        if reason is FinishReason.STOP:
            vectors = torch.stack(job.vectors)  # type: ignore[arg-type]
            self._finished.append(lambda: job.sink(vectors, reason))
        else:
            self._finished.append(lambda: job.sink(None, reason))

    def _send(self) -> None:
        if self._finished:
            calls, self._finished = self._finished, []
            self.on_outputs(calls)

    def _publish(self, step_seconds: float | None) -> None:
        running = sum(1 for job in self._jobs.values() if job.done or len(job.order) < len(job.inputs))
        self.load = Load(running, len(self._jobs) - running + len(self.inbox), 0.0)
        self.recorder.publish(step_seconds, self.load, 0)
