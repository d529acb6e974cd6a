"""Prometheus metrics of the engine, named after vLLM's with a `conduit:` prefix (and vLLM's
`model_name` label), so dashboards port by a prefix change.

The engine loop tells a StepRecorder what happened and publishes once per step, not per token:
counters move by the step's totals, and the latency histograms take a step's observations in bulk
(every sequence decoded in a step waited the same time since the previous step). So the histograms
here are a small collector of their own: prometheus_client's Histogram observes one value per call.

Served by `serve()` on `--metrics-port` (off by default), from its own registry. Beside them, the
`Load` snapshot each publish takes, which routers read over gRPC (GetLoad) with or without metrics.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from engine_service.core.scheduler import Scheduler
    from engine_service.core.sequence import Sequence as EngineSequence

# vLLM's buckets for the same metrics.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BulkHistogram(Collector):
    """A histogram with one label value that takes many observations in one call."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], label: tuple[str, str]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = list(buckets)
        self.label = label
        self._counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += count
            self._sum += value * count

    def observe_many(self, values: Iterable[tuple[float, int]]) -> None:
        """(value, how many times) pairs, under one lock."""
        with self._lock:
            for value, count in values:
                self._counts[bisect.bisect_left(self.bounds, value)] += count
                self._sum += value * count

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label[0]])
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], counts):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric([self.label[1]], buckets, total)
        yield family


class EngineMetrics:
    """The engine's metrics for one served model, in a registry of their own."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        label = ("model_name", model_name)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, [label[0]], registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, [label[0]], registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> BulkHistogram:
            h = BulkHistogram(name, doc, buckets, label)
            r.register(h)
            return h

        self.running = gauge("conduit:num_requests_running", "Requests with a sequence in the running batch.")
        self.waiting = gauge("conduit:num_requests_waiting", "Requests waiting to be (re)admitted to the batch.")
        self.kv_usage = gauge("conduit:kv_cache_usage_perc",
                              "KV-cache usage as a fraction, 0 to 1: 1 means every block is in use.")
        self.preemptions = counter("conduit:num_preemptions", "Sequences preempted because the KV cache was full.")
        self.steps_given_way = counter("conduit:batch_steps_given_way",
                                       "Batch steps stopped between layers for an interactive arrival (rerun later).")
        self.prompt_tokens = counter("conduit:prompt_tokens", "Prompt tokens of requests whose prefill completed.")
        self.generation_tokens = counter("conduit:generation_tokens", "Generated tokens (all choices).")
        self.prefix_cache_queries = counter("conduit:prefix_cache_queries",
                                            "Tokens looked up in the prefix cache (admitted sequences' tokens).")
        self.prefix_cache_hits = counter("conduit:prefix_cache_hits", "Tokens found in the prefix cache.")
        # Speculative decoding, as vLLM names it (core/speculation.py).
        self.spec_drafts = counter("conduit:spec_decode_num_drafts", "Drafts checked (one per sequence and step).")
        self.spec_draft_tokens = counter("conduit:spec_decode_num_draft_tokens", "Draft tokens checked.")
        self.spec_accepted_tokens = counter("conduit:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_position = Counter(
            "conduit:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by their place in the draft.",
            [label[0], "position"], registry=r)
        self._success = Counter("conduit:request_success", "Finished choices (n > 1 counts each), by reason.",
                                [label[0], "finished_reason"], registry=r)
        self._model_name = model_name
        self.ttft = histogram("conduit:time_to_first_token_seconds",
                              "Time from arrival to a choice's first token.", TTFT_BUCKETS)
        self.itl = histogram("conduit:inter_token_latency_seconds",
                             "Time between two tokens of a choice.", ITL_BUCKETS)
        self.e2e = histogram("conduit:e2e_request_latency_seconds",
                             "Time from arrival to a choice's end.", E2E_BUCKETS)
        self.step = histogram("conduit:step_duration_seconds",
                              "Time of one engine step (schedule, forward, sample, send).", STEP_BUCKETS)
        # LoRA adapters (core/adapters.py): vLLM's info gauge, which gateways' LoRA-affinity scorers read (llm-d's),
        # and each adapter's own counts.
        self.lora_info = Gauge("conduit:lora_requests_info",
                               "The adapters of the running and waiting requests, comma-joined, in labels; the "
                               "value is when they were read (Unix seconds), as vLLM's.",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)
        self._lora_info_labels: tuple[str, str, str] | None = None
        lora_label = [label[0], "lora_name"]
        self.lora_success = Counter("conduit:lora_request_success", "Finished choices of each LoRA adapter.",
                                    lora_label, registry=r)
        self.lora_prompt_tokens = Counter("conduit:lora_prompt_tokens",
                                          "Prompt tokens of each LoRA adapter's requests whose prefill completed.",
                                          lora_label, registry=r)
        self.lora_generation_tokens = Counter("conduit:lora_generation_tokens",
                                              "Tokens generated with each LoRA adapter.", lora_label, registry=r)
        self.cpu_threads = gauge("conduit:cpu_threads",
                                 "Torch CPU threads the engine's steps run on now (fewer than --threads while "
                                 "another engine sharing the cores has work: --core-share).")

    def cache_config(self, block_size: int, num_blocks: int, prefix_caching: bool) -> None:
        """vLLM's info gauge of the cache layout (value 1, the facts in labels), which the Kubernetes
        inference gateway's endpoint picker reads (its --cache-info-metric) to size its prefix view."""
        Gauge("conduit:cache_config_info", "The KV cache's configuration, in labels (the value is 1).",
              ["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"], registry=self.registry,
              ).labels(self._model_name, str(block_size), str(num_blocks), str(prefix_caching)).set(1)

    def cpu_info(self, model: str, facts: dict[str, str]) -> None:
        """The CPU the engine computes on, so a figure scraped from it can be told apart by machine
        (model/cpu_isa.py: whether oneDNN uses AMX changes speed and rounding)."""
        Gauge("conduit:cpu_info", "The CPU the engine computes on, in labels (the value is 1).",
              ["model_name", "cpu", *facts], registry=self.registry).labels(self._model_name, model, *facts.values()).set(1)

    def finished(self, reasons: dict[str, int]) -> None:
        for reason, count in reasons.items():
            self._success.labels(self._model_name, reason).inc(count)

    def lora_requests(self, max_loras: int, running: Iterable[str], waiting: Iterable[str]) -> None:
        """One series at a time (vLLM keeps every label set it wrote; a scraper takes the newest value)."""
        labels = (str(max_loras), ",".join(sorted(running)), ",".join(sorted(waiting)))
        if labels != self._lora_info_labels:
            if self._lora_info_labels is not None:
                self.lora_info.remove(*self._lora_info_labels)
            self._lora_info_labels = labels
        self.lora_info.labels(*labels).set_to_current_time()

    def lora_counts(self, counter: Counter, counts: dict[str, int]) -> None:
        for name, count in counts.items():
            counter.labels(self._model_name, name).inc(count)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve /metrics (any path, in fact) over HTTP on a background thread."""
        start_http_server(port, addr=host, registry=self.registry)


@dataclass(frozen=True)
class Load:
    """What a router weighs: requests running and waiting, and the KV cache's used fraction."""

    running: int
    waiting: int
    kv_usage: float

    @classmethod
    def of(cls, scheduler: Scheduler, queued: int) -> Load:
        """The scheduler's load now, with `queued` requests not yet taken from the inbox."""
        running = {seq.request.request_id for seq in scheduler.running}
        waiting = {seq.request.request_id for seq in scheduler.waiting} - running
        blocks = scheduler.blocks
        return cls(len(running), len(waiting) + queued, 1.0 - blocks.num_free / blocks.num_blocks)


class StepRecorder:
    """What the engine loop saw since the last publish(). Without metrics it keeps nothing."""

    def __init__(self, metrics: EngineMetrics | None) -> None:
        self.metrics = metrics
        self._finished_reasons: collections.Counter[str] = collections.Counter()
        self._finished_arrivals: collections.Counter[float] = collections.Counter()
        self._prompt_tokens = 0
        self._generated = 0
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)  # (queries, hits)
        # Each LoRA adapter's (by name): finished choices, prompt tokens, generated tokens.
        self._lora: dict[str, collections.Counter[str]] = {kind: collections.Counter()
                                                           for kind in ("success", "prompt", "generated")}

    def prompt_done(self, tokens: int, adapter: str = "") -> None:
        if self.metrics is not None:
            self._prompt_tokens += tokens
            if adapter:
                self._lora["prompt"][adapter] += tokens

    def tokens(self, seqs: list[EngineSequence]) -> None:
        """Each sequence got a token now: generated count, time to first token, inter-token latency."""
        if self.metrics is None:
            return
        self._generated += len(seqs)
        for seq in seqs:
            if seq.request.adapter is not None:
                self._lora["generated"][seq.request.adapter.name] += 1
        now = time.monotonic()
        first: collections.Counter[float] = collections.Counter()
        previous: collections.Counter[float] = collections.Counter()
        for seq in seqs:
            if seq.num_output == 1:
                first[seq.request.arrival] += 1
            else:
                previous[seq.last_token_time] += 1
            seq.last_token_time = now
        if first:
            self.metrics.ttft.observe_many((now - t, k) for t, k in first.items())
        if previous:
            self.metrics.itl.observe_many((now - t, k) for t, k in previous.items())

    def drafts(self, lengths: list[int], accepted: list[int]) -> None:
        """A step checked drafts of these lengths, of which these many tokens were taken."""
        metrics = self.metrics
        if metrics is None or not lengths:
            return
        metrics.spec_drafts.inc(len(lengths))
        metrics.spec_draft_tokens.inc(sum(lengths))
        metrics.spec_accepted_tokens.inc(sum(accepted))
        for position in range(max(accepted)):
            taken = sum(count > position for count in accepted)
            metrics.spec_accepted_per_position.labels(metrics._model_name, str(position)).inc(taken)

    def gave_way(self) -> None:
        """A batch step stopped for an interactive arrival (core/engine_core.py)."""
        if self.metrics is not None:
            self.metrics.steps_given_way.inc()

    def finished(self, reason: str, arrival: float, count: int = 1, adapter: str = "") -> None:
        if self.metrics is not None and count:
            self._finished_reasons[reason] += count
            self._finished_arrivals[arrival] += count
            if adapter:
                self._lora["success"][adapter] += count

    def lora_requests(self, max_loras: int, scheduler: Scheduler) -> None:
        """The adapters of the running and of the waiting requests, as of this publish."""
        if self.metrics is None:
            return
        def names(seqs: Iterable[EngineSequence]) -> set[str]:
            return {seq.request.adapter.name for seq in seqs if seq.request.adapter is not None}
        self.metrics.lora_requests(max_loras, names(scheduler.running), names(scheduler.waiting))

    def publish(self, step_seconds: float | None, load: Load, preemptions: int, prefix_queries: int = 0,
                prefix_hits: int = 0) -> None:
        """Once per step (or idle wake): gauges set, counters moved by what was recorded since
        (preemptions and prefix-cache tokens come as totals since the start)."""
        metrics = self.metrics
        if metrics is None:
            return
        if step_seconds is not None:
            metrics.step.observe(step_seconds)
        metrics.running.set(load.running)
        metrics.waiting.set(load.waiting)
        metrics.kv_usage.set(load.kv_usage)
        if preemptions != self._preemptions_seen:
            metrics.preemptions.inc(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions
        if (prefix_queries, prefix_hits) != self._prefix_seen:
            metrics.prefix_cache_queries.inc(prefix_queries - self._prefix_seen[0])
            metrics.prefix_cache_hits.inc(prefix_hits - self._prefix_seen[1])
            self._prefix_seen = (prefix_queries, prefix_hits)
        if self._prompt_tokens:
            metrics.prompt_tokens.inc(self._prompt_tokens)
            self._prompt_tokens = 0
        if self._generated:
            metrics.generation_tokens.inc(self._generated)
            self._generated = 0
        if self._finished_reasons:
            metrics.finished(self._finished_reasons)
            now = time.monotonic()
            metrics.e2e.observe_many((now - t, k) for t, k in self._finished_arrivals.items())
            self._finished_reasons.clear()
            self._finished_arrivals.clear()
        for kind, counter in (("success", metrics.lora_success), ("prompt", metrics.lora_prompt_tokens),
                              ("generated", metrics.lora_generation_tokens)):
            if self._lora[kind]:
                metrics.lora_counts(counter, self._lora[kind])
                self._lora[kind].clear()
