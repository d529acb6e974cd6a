"""The real engine, secured and observed: one stack whose engine requires a token and mutual TLS,
serves Prometheus metrics, logs JSON, and has fault injection on (for prompts holding MARKER).

Proves on real processes: UNAUTHENTICATED without the token and health open; mutual TLS refusing a
client without a certificate; the shim (with the token and a client certificate) serving a chat;
x-request-id in the engine's log lines; metrics that agree with the usage clients got; and a
failing step failing only the request at fault (INTERNAL naming its id; 500 through the shim),
while a request batched beside it finishes with the same output as alone.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients import EngineClient, Internal, Unauthenticated, Unavailable
from launcher.stack import Stack, TLSFiles, free_port
from common import ANSWER, MODEL, QUESTION, ask, assert_same_greedy_until_near_tie, text_of
from conftest import STARTUP_TIMEOUT_S
from engine_service.core.faults import FAULT_INJECT_ENV
from engine_tls import make_tls_files

pytestmark = pytest.mark.model

TOKEN = "engine-test-token"
MARKER = "zebra-fault-marker"
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[TLSFiles, TLSFiles]:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secured(tls: tuple[TLSFiles, TLSFiles], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(token=TOKEN, tls=tls[0], log_dir=tmp_path_factory.mktemp("logs"), metrics_port=free_port(),
               engine_args=["--log-format", "json"], engine_env={FAULT_INJECT_ENV: MARKER},
               startup_timeout=STARTUP_TIMEOUT_S) as stack:
        yield stack


@pytest.fixture(scope="module")
def engine(secured: Stack) -> Iterator[EngineClient]:
    with secured.client(timeout=120) as client:
        yield client


def log_entries(path: Path) -> list[dict]:
    """The engine log's JSON lines (other output, e.g. from libraries, is skipped)."""
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                entries.append(json.loads(line))
            except ValueError:
                pass
    return entries


def wait_for_log(path: Path, predicate, timeout_s: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [entry for entry in log_entries(path) if predicate(entry)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


# ------------------------------------------------------------------ security


def test_engine_requires_the_token_but_not_for_health(secured: Stack, engine: EngineClient) -> None:
    assert engine.list_models()[0].id == MODEL
    for token in (None, "wrong-token"):
        with secured.client(token=token, timeout=30) as client:
            with pytest.raises(Unauthenticated):
                client.list_models()
            with pytest.raises(Unauthenticated):
                client.complete(messages=QUESTION, max_tokens=4)
            assert client.health() == "SERVING"


def test_mutual_tls_refuses_a_client_without_a_certificate(secured: Stack, tls: tuple[TLSFiles, TLSFiles]) -> None:
    files, rogue = tls
    for kwargs in ({"tls_ca": files.ca}, rogue.client_kwargs()):
        with EngineClient(secured.engine_address, token=TOKEN, timeout=10, **kwargs) as client:
            with pytest.raises(Unavailable):
                client.list_models()
    with EngineClient(secured.engine_address, token=TOKEN, timeout=10) as plaintext:
        with pytest.raises(Unavailable):
            plaintext.list_models()


def test_shim_in_front_of_the_secured_engine_serves_a_chat(secured: Stack) -> None:
    with openai.OpenAI(base_url=secured.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        assert text_of(ask(client)) == ANSWER


# ------------------------------------------------------------------ request ids in the logs


def test_x_request_id_names_the_request_in_the_engine_log(secured: Stack, engine: EngineClient) -> None:
    request_id = f"abc-{uuid.uuid4().hex[:8]}"
    engine.complete(messages=QUESTION, max_tokens=8, metadata=[("x-request-id", request_id)])
    mine = wait_for_log(secured.engine_log,
                        lambda e: e.get("request_id") == request_id and e["msg"].startswith("finished"))
    assert mine, f"no 'finished' line for {request_id} in {secured.engine_log}"
    entries = [e for e in log_entries(secured.engine_log) if e.get("request_id") == request_id]
    assert any(e["msg"].startswith("generate:") for e in entries)
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)
    # Without the metadata, the request's own request_id names it.
    engine.complete(request_id="own-id-42", messages=QUESTION, max_tokens=2)
    assert wait_for_log(secured.engine_log, lambda e: e.get("request_id") == "own-id-42")


# ------------------------------------------------------------------ metrics


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.labels.get("model_name", MODEL) == MODEL}


def scrape_settled(url: str, timeout_s: float = 10) -> dict[tuple[str, tuple], float]:
    """A scrape once the engine has published the steps of earlier requests. It publishes a step's
    metrics right after the step, so a client can have its whole answer a moment before the last
    step's tokens are counted (CI once saw an earlier test's last token land in this test's count).
    Settled: nothing running or waiting, and the token counters the same over two scrapes."""
    counters = [("conduit:generation_tokens_total", ()), ("conduit:prompt_tokens_total", ())]
    deadline = time.monotonic() + timeout_s
    last = scrape(url)
    while True:
        time.sleep(0.2)
        now = scrape(url)
        idle = now.get(("conduit:num_requests_running", ())) == 0 and now.get(("conduit:num_requests_waiting", ())) == 0
        if (idle and all(now.get(k) == last.get(k) for k in counters)) or time.monotonic() > deadline:
            return now
        last = now


def test_metrics_agree_with_the_usage_clients_got(secured: Stack, engine: EngineClient) -> None:
    url = secured.metrics_url
    before = scrape_settled(url)
    results = [engine.complete(messages=QUESTION, temperature=0, max_tokens=30),
               engine.complete(messages=STORY, max_tokens=12, ignore_eos=True, n=2, seed=3)]
    with ThreadPoolExecutor(4) as pool:  # some batched together, so steps hold several sequences
        results += list(pool.map(lambda k: engine.complete(prompt=f"Count to {k}:", max_tokens=6 + k,
                                                           ignore_eos=True), range(4)))
    choices = [choice for result in results for choice in result.choices]
    generated = sum(choice.completion_tokens for choice in choices)
    assert generated == sum(r.usage.completion_tokens for r in results)
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    by_reason: dict[str, int] = {}
    for choice in choices:
        by_reason[choice.finish_reason] = by_reason.get(choice.finish_reason, 0) + 1
    assert by_reason.get("length", 0) >= 6

    def moved(after: dict, name: str, labels: tuple = ()) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    deadline = time.monotonic() + 10  # the engine publishes right after the step that sent the last token
    while True:
        after = scrape(url)
        if moved(after, "conduit:generation_tokens_total") >= generated or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert moved(after, "conduit:generation_tokens_total") == generated
    assert moved(after, "conduit:prompt_tokens_total") == prompt_tokens
    for reason, count in by_reason.items():
        assert moved(after, "conduit:request_success_total", (("finished_reason", reason),)) == count, reason
    assert moved(after, "conduit:time_to_first_token_seconds_count") == len(choices)
    assert moved(after, "conduit:e2e_request_latency_seconds_count") == len(choices)
    assert moved(after, "conduit:inter_token_latency_seconds_count") == generated - len(choices)
    assert moved(after, "conduit:step_duration_seconds_count") >= max(c.completion_tokens for c in choices)
    assert moved(after, "conduit:step_duration_seconds_sum") > 0
    assert after[("conduit:num_requests_running", ())] == 0
    assert after[("conduit:num_requests_waiting", ())] == 0
    assert after[("conduit:kv_cache_usage_perc", ())] == 0  # every block came back
    assert ("conduit:num_preemptions_total", ()) in after


# ------------------------------------------------------------------ faults


def test_a_failing_step_fails_only_the_request_at_fault(secured: Stack, engine: EngineClient) -> None:
    params = {"messages": STORY, "temperature": 0, "max_tokens": 64, "ignore_eos": True, "logprobs": True,
              "top_logprobs": 2}
    alone = engine.complete(**params)
    fault_id = f"fault-{uuid.uuid4().hex[:8]}"
    with engine.generate(**params) as stream:
        logprobs = []
        for response in stream:  # the bystander is running before the faulty request arrives
            if response.WhichOneof("kind") == "chunk":
                logprobs.extend(response.chunk.logprobs)
                break
        with pytest.raises(Internal) as caught:
            engine.complete(messages=[{"role": "user", "content": f"Say {MARKER}."}], max_tokens=8,
                            metadata=[("x-request-id", fault_id)])
        assert fault_id in caught.value.message
        finals = []
        for response in stream:
            kind = response.WhichOneof("kind")
            if kind == "chunk":
                logprobs.extend(response.chunk.logprobs)
            elif kind == "final":
                finals.append(response.final)
    # The failed step rewinds the bystander, which recomputes its cache (see common.py): the same
    # greedy tokens up to a near-tie is all a recompute can promise, and a fault that reached it
    # would show long before.
    compared = assert_same_greedy_until_near_tie(alone.choices[0].logprobs, logprobs)
    assert compared >= 8, "the request batched beside the fault must not notice it"  # 30 on this prompt
    assert [f.completion_tokens for f in finals] == [64]
    failures = wait_for_log(secured.engine_log, lambda e: e.get("request_id") == fault_id and "exc" in e)
    assert failures and "InjectedFault" in failures[-1]["exc"]
    assert failures[-1]["level"] == "ERROR"
    assert engine.complete(messages=QUESTION, temperature=0, max_tokens=30).text == ANSWER  # still serving


def test_a_failing_request_is_a_500_through_the_shim(secured: Stack) -> None:
    with openai.OpenAI(base_url=secured.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            ask(client, messages=[{"role": "user", "content": f"Repeat {MARKER}"}])
        assert caught.value.status_code == 500
        assert text_of(ask(client)) == ANSWER
