"""Fast checks of the engine's operating parts that need no model: the scheduler's one-suspect rule
(after a failed step), the bulk histograms and metric names as Prometheus parses them, and the
text and JSON log formats with request ids."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import free_port
from engine_service.core.block_manager import BlockManager
from engine_service.core.metrics import EngineMetrics
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence
from conduit_common.logs import REQUEST_ID, JsonFormatter, RequestIdFilter, TextFormatter, request_extra

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)


def make_seq(request_id: str, prompt_len: int = 3) -> Sequence:
    params = RequestParams(SamplingParams(), StoppingParams(), n=1)
    request = Request(request_id, list(range(1, prompt_len + 1)), params, max_tokens=100, sink=lambda events: None)
    seq = Sequence(request, 0, stop_ids=set(), matcher=None, output=None)
    request.sequences = [seq]
    return seq


def scheduled_ids(scheduler: Scheduler) -> list[str]:
    batch = scheduler.schedule()
    scheduler.advance(batch)
    seqs = [*batch.decode, *(seq for seq, _ in batch.prefill)]
    for seq in seqs:
        if seq.num_cached == len(seq.token_ids):
            seq.token_ids.append(7)
    return [seq.request.request_id for seq in seqs]


def test_a_step_holds_at_most_one_suspect_beside_the_others() -> None:
    scheduler = Scheduler(BlockManager(64, 4, lambda src, dst: None), max_batch_size=8, max_step_tokens=64)
    a, b, c, d = (make_seq(name) for name in "abcd")
    scheduler.waiting.extend([a, b, c])
    assert sorted(scheduled_ids(scheduler)) == ["a", "b", "c"]
    scheduler.suspects = {"a", "b"}
    first = scheduled_ids(scheduler)
    assert "c" in first and len({"a", "b"} & set(first)) == 1, first
    scheduler.waiting.append(d)  # newcomers are not held back by suspects already running
    second = scheduled_ids(scheduler)
    assert {"c", "d"} <= set(second) and len({"a", "b"} & set(second)) == 1, second
    scheduler.suspects.discard(first[0] if first[0] in "ab" else first[1])
    assert sorted(scheduled_ids(scheduler)) == ["a", "b", "c", "d"]
    scheduler.suspects = set()
    assert sorted(scheduled_ids(scheduler)) == ["a", "b", "c", "d"]


def test_suspects_waiting_in_line_are_admitted_one_per_step() -> None:
    scheduler = Scheduler(BlockManager(64, 4, lambda src, dst: None), max_batch_size=8, max_step_tokens=64)
    a, b = make_seq("a"), make_seq("b")
    scheduler.waiting.extend([a, b])
    scheduler.suspects = {"a", "b"}
    assert scheduled_ids(scheduler) == ["a"]
    assert scheduled_ids(scheduler) == ["a"], "a (running) keeps the one suspect slot while it is suspected"
    scheduler.suspects.discard("a")
    assert sorted(scheduled_ids(scheduler)) == ["a", "b"]


def scrape(metrics: EngineMetrics) -> dict[str, dict[tuple, float]]:
    """{sample name: {label items: value}} from the real HTTP endpoint."""
    port = free_port()
    metrics.serve(port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_have_vllm_names_and_bulk_histograms_count_right() -> None:
    metrics = EngineMetrics("m")
    metrics.generation_tokens.inc(5)
    metrics.finished({"stop": 2, "length": 1})
    metrics.itl.observe_many([(0.02, 3), (0.3, 2)])
    metrics.itl.observe(100.0)
    metrics.kv_usage.set(0.25)
    samples = scrape(metrics)
    label = (("model_name", "m"),)
    assert samples["conduit:generation_tokens_total"][label] == 5
    assert samples["conduit:request_success_total"][(("finished_reason", "stop"), ("model_name", "m"))] == 2
    assert samples["conduit:kv_cache_usage_perc"][label] == 0.25
    buckets = samples["conduit:inter_token_latency_seconds_bucket"]
    assert buckets[(("le", "0.025"), ("model_name", "m"))] == 3
    assert buckets[(("le", "0.3"), ("model_name", "m"))] == 5  # bounds are inclusive
    assert buckets[(("le", "80.0"), ("model_name", "m"))] == 5
    assert buckets[(("le", "+Inf"), ("model_name", "m"))] == 6
    assert samples["conduit:inter_token_latency_seconds_count"][label] == 6
    assert abs(samples["conduit:inter_token_latency_seconds_sum"][label] - (0.06 + 0.6 + 100.0)) < 1e-9
    for name in ("conduit:num_requests_running", "conduit:num_requests_waiting", "conduit:num_preemptions_total",
                 "conduit:prompt_tokens_total", "conduit:time_to_first_token_seconds_count",
                 "conduit:e2e_request_latency_seconds_count", "conduit:step_duration_seconds_count"):
        assert label in samples[name], name


def record(message: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("engine_service.test", logging.INFO, __file__, 1, message, (), None)
    rec.__dict__.update(extra)
    RequestIdFilter().filter(rec)
    return rec


def test_log_lines_name_the_request_from_extra_or_context() -> None:
    assert "[abc]" in TextFormatter().format(record("hello", **request_extra("abc")))
    assert "[" not in TextFormatter().format(record("no request"))
    token = REQUEST_ID.set("from-context")
    try:
        line = JsonFormatter().format(record("inside a call"))
    finally:
        REQUEST_ID.reset(token)
    entry = json.loads(line)
    assert entry["request_id"] == "from-context" and entry["msg"] == "inside a call"
    assert entry["level"] == "INFO" and entry["logger"] == "engine_service.test" and entry["ts"].endswith("Z")
    assert json.loads(JsonFormatter().format(record("none")))["request_id"] is None
