"""Two engine replicas (default model) behind one shim, on real processes: failover.

- Requests sharing a long prompt prefix stay on one replica (the shim's cache-aware routing), whose
  prefix cache then serves it (cached_tokens); short prompts are spread over both replicas.
- A prefix computed on one engine without the shim draws the shim's requests sharing it to that engine:
  the router follows the engines' KV events (its exact view), not only the prompts it sent.
- One replica frozen with SIGSTOP (its kernel still ACKs TCP) under 8 streams: its streams end with
  an error event within the shim's keepalive bound, the other's stream on, and new requests are
  served there; SIGCONT brings it back.
- One replica SIGKILLed while streams run on both: its streams end with an error event (the SDK
  raises; never a [DONE]), the survivor's streams finish, and new requests all succeed on the
  survivor.
- The killed replica restarted on the same port gets work again, without restarting the shim.
- Restarted with --served-model-name, it serves that name only: the shim regroups its engines by
  model, routes by the request's model, lists both, and a 404 names both.
Which replica served a request is read from the engines' logs, which name each generate's
request id (the shim forwards the client's X-Request-Id).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from clients import EngineClient
from launcher.stack import Stack
from engine_service.core.config import EngineConfig
from common import MODEL, QUESTION, STORY
from conftest import STARTUP_TIMEOUT_S
from test_replicas import wait_until
from test_routing import router_metrics

SEGMENTS = EngineConfig().segments

pytestmark = pytest.mark.model

WAIT_S = 120.0
STREAMS = 4
STREAM_TOKENS = 96  # long enough to be mid-stream on both replicas when the signal lands
RENAMED = "smol-renamed"
FROZEN_STREAMS = 8
# The shim's keepalive: a frozen engine's calls fail within about 1 + 1 s of its last message.
KEEPALIVE_ARGS = ["--engine-keepalive", "1", "--engine-keepalive-timeout", "1"]
# Far beyond that bound, for a loaded machine; a shim without keepalive leaves the streams open past it.
FROZEN_STREAM_END_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(replicas=2, log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=STARTUP_TIMEOUT_S,
               shim_args=KEEPALIVE_ARGS) as running:
        yield running


def served_by(stack: Stack, request_id: str) -> list[int]:
    """The replicas whose log shows a generate for `request_id`."""
    found = []
    for index in range(len(stack.engine_ports)):
        log: Path = stack.replica_log(index)
        text = log.read_text(errors="replace") if log.exists() else ""
        if any("generate:" in line and f"[{request_id}]" in line for line in text.splitlines()):
            found.append(index)
    return found


def short_request(client: openai.OpenAI, request_id: str) -> None:
    response = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                              extra_headers={"X-Request-Id": request_id})
    assert response.choices[0].finish_reason == "length"


def test_a_shared_prefix_stays_on_one_replica_and_is_served_from_its_cache(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    tag = uuid.uuid4().hex[:8]
    system = {"role": "system", "content": f"Session {tag}. " + " ".join(f"Rule {k}: be brief." for k in range(60))}
    ids = [f"sticky-{tag}-{i}" for i in range(3)]
    usages = []
    for i, request_id in enumerate(ids):
        response = client.chat.completions.create(
            model=MODEL, messages=[system, {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
            max_tokens=2, extra_headers={"X-Request-Id": request_id})
        usages.append(response.usage)
    placed = [served_by(stack, request_id) for request_id in ids]
    assert all(len(where) == 1 for where in placed) and len({where[0] for where in placed}) == 1, placed
    assert usages[0].prompt_tokens > 300
    for usage in usages[1:]:  # the system prompt's blocks, at least
        assert usage.prompt_tokens_details.cached_tokens >= 256, usage


def test_a_prefix_cached_on_one_engine_draws_the_shims_requests_there_by_its_kv_events(stack: Stack) -> None:
    """Documents computed on an engine directly (so the shim's text view of what it sent knows nothing of
    them), placed out of turn: each question through the shim goes where its document is cached, as a
    cache hit (the text view would call each a miss and place it by load), and is served from that cache."""
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    tag = uuid.uuid4().hex[:8]
    placement = (1, 1, 0, 1)
    documents = [{"role": "system", "content": f"Document {tag}-{doc}: " + " ".join(f"w{doc}x{i}" for i in range(120))}
                 for doc in range(len(placement))]

    def kv_blocks() -> list[float]:
        found = router_metrics(stack.shim_url)
        return [found.get(("conduit:router_replica_kv_blocks", address), 0.0) for address in stack.engine_addresses]

    for document, engine in zip(documents, placement):
        before = kv_blocks()[engine]
        with EngineClient(stack.engine_addresses[engine], timeout=WAIT_S) as direct:
            direct.complete(messages=[document, {"role": "user", "content": "Seen?"}], max_tokens=1)
        wait_until(lambda: kv_blocks()[engine] > before, 30.0)  # its events reached the shim
    hits = [router_metrics(stack.shim_url).get(("conduit:router_requests_total", address, "cache_hit"), 0.0)
            for address in stack.engine_addresses]
    for document, engine in zip(documents, placement):
        response = client.chat.completions.create(
            model=MODEL, messages=[document, {"role": "user", "content": "One word?"}], max_tokens=1)
        usage = response.usage
        # All but the end, to a prompt segment's boundary (model/step.py).
        assert usage.prompt_tokens_details.cached_tokens >= SEGMENTS.floor(usage.prompt_tokens - 2 * 16), usage
    found = router_metrics(stack.shim_url)
    assert [found.get(("conduit:router_requests_total", address, "cache_hit"), 0.0) - hit
            for address, hit in zip(stack.engine_addresses, hits)] == [placement.count(0), placement.count(1)]


def test_a_frozen_replica_fails_its_streams_within_the_keepalive_bound(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    tag = uuid.uuid4().hex[:8]
    stream_ids = [f"frozen-{tag}-{i}" for i in range(FROZEN_STREAMS)]
    started = [threading.Event() for _ in stream_ids]
    ended = {request_id: threading.Event() for request_id in stream_ids}
    outcomes: dict[str, str] = {}
    last_token_at: dict[str, float] = {}

    def run_stream(k: int) -> None:
        request_id = stream_ids[k]
        try:
            stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=4096, temperature=0,
                                                    stream=True, extra_headers={"X-Request-Id": request_id})
            for chunk in stream:
                last_token_at[request_id] = time.monotonic()
                started[k].set()
                if ended[request_id].is_set():  # the test is done with it
                    stream.close()
                    return
            outcomes[request_id] = "finished"
        except openai.APIError as error:
            outcomes[request_id] = f"error:{error}"
        finally:
            started[k].set()
            ended[request_id].set()

    threads = [threading.Thread(target=run_stream, args=(k,), daemon=True) for k in range(FROZEN_STREAMS)]
    frozen = stack.engines[1]
    assert frozen is not None
    try:
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(WAIT_S), "a stream never started"
        assert not outcomes, f"streams ended before the freeze: {outcomes}"
        frozen.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        deadline = frozen_at + FROZEN_STREAM_END_S
        # Each stream ends (the frozen replica's) or gets tokens well after the freeze (the other's).
        while not all(ended[r].is_set() or last_token_at[r] > frozen_at + 1.0 for r in stream_ids):
            assert time.monotonic() < deadline, f"a stream on the frozen engine is still open: {outcomes}"
            time.sleep(0.05)
        placed = {request_id: served_by(stack, request_id) for request_id in stream_ids}
        assert {tuple(where) for where in placed.values()} == {(0,), (1,)}, placed  # streams ran on both
        for request_id, where in placed.items():
            outcome = outcomes.get(request_id, "streaming")
            if where == [1]:  # an error event the SDK raises, not a clean end
                assert outcome.startswith("error:") and "unavailable" in outcome.lower(), outcome
            else:  # still streaming (or the model ended its story meanwhile)
                assert outcome in ("streaming", "finished"), outcome

        after_ids = [f"after-freeze-{tag}-{i}" for i in range(4)]
        for request_id in after_ids:
            short_request(client, request_id)
        assert [served_by(stack, request_id) for request_id in after_ids] == [[0]] * len(after_ids)
    finally:
        frozen.send_signal(signal.SIGCONT)
        for event in ended.values():
            event.set()
        for thread in threads:
            thread.join(WAIT_S)
    # Thawed, it gets work again (and the tests after this one find both replicas serving).
    deadline = time.monotonic() + WAIT_S
    k = 0
    while True:
        request_id = f"thawed-{tag}-{k}"
        short_request(client, request_id)
        if served_by(stack, request_id) == [1]:
            break
        assert time.monotonic() < deadline, "the thawed replica got no work"
        k += 1
        time.sleep(0.1)


def test_failover_and_return_of_a_replica(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    tag = uuid.uuid4().hex[:8]

    # Short prompts (no prefix to follow): six requests in a row reach both replicas.
    spread_ids = [f"spread-{tag}-{i}" for i in range(6)]
    for request_id in spread_ids:
        short_request(client, request_id)
    placed = [served_by(stack, request_id) for request_id in spread_ids]
    assert all(len(where) == 1 for where in placed), placed
    assert {where[0] for where in placed} == {0, 1}, placed

    # Streams on both replicas; then replica 1 dies.
    stream_ids = [f"stream-{tag}-{i}" for i in range(STREAMS)]
    started = [threading.Event() for _ in stream_ids]
    outcomes: dict[str, str] = {}

    def run_stream(k: int) -> None:
        request_id = stream_ids[k]
        finish = None
        try:
            # Greedy: the story runs to max_tokens, so no stream ends by itself before the kill.
            stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=STREAM_TOKENS,
                                                    temperature=0,
                                                    stream=True, extra_headers={"X-Request-Id": request_id})
            for chunk in stream:
                started[k].set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            outcomes[request_id] = f"finished:{finish}"
        except openai.APIError as error:
            outcomes[request_id] = f"error:{error}"
        finally:
            started[k].set()

    threads = [threading.Thread(target=run_stream, args=(k,), daemon=True) for k in range(STREAMS)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(WAIT_S), "a stream never started"
    assert not outcomes, f"streams ended before the kill: {outcomes}"
    victim = stack.engines[1]
    assert victim is not None
    victim.kill()
    victim.wait()

    # Under that load, new requests all succeed, on the survivor.
    after_ids = [f"after-{tag}-{i}" for i in range(4)]
    for request_id in after_ids:
        short_request(client, request_id)
    assert [served_by(stack, request_id) for request_id in after_ids] == [[0]] * len(after_ids)

    for thread in threads:
        thread.join(WAIT_S)
    placed = {request_id: served_by(stack, request_id) for request_id in stream_ids}
    assert {tuple(where) for where in placed.values()} == {(0,), (1,)}, placed  # streams ran on both
    for request_id, where in placed.items():
        if where == [1]:  # cut: an error event the SDK raises, not a clean end
            assert outcomes[request_id].startswith("error:") and "unavailable" in outcomes[request_id].lower()
        else:
            # A clean end on the survivor (sampled, so the model may stop before max_tokens).
            assert outcomes[request_id] in ("finished:length", "finished:stop"), outcomes[request_id]

    # The replica comes back on its port: the same shim gives it work again.
    stack.restart_engine(1)
    deadline = time.monotonic() + WAIT_S
    k = 0
    while True:
        request_id = f"back-{tag}-{k}"
        short_request(client, request_id)
        if served_by(stack, request_id) == [1]:
            break
        assert time.monotonic() < deadline, "the restarted replica got no work"
        k += 1
        time.sleep(0.1)


def test_a_replica_restarted_under_another_name_is_routed_by_model(stack: Stack) -> None:
    """--served-model-name, and the shim regrouping its engines by the model each reports."""
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    victim = stack.engines[1]
    assert victim is not None
    victim.kill()
    victim.wait()
    stack.restart_engine(1, extra_args=["--served-model-name", RENAMED])

    tag = uuid.uuid4().hex[:8]
    for k in range(4):  # the unknown name makes the shim ask its engines again
        request_id = f"renamed-{tag}-{k}"
        response = client.chat.completions.create(model=RENAMED, messages=QUESTION, max_tokens=2,
                                                  extra_headers={"X-Request-Id": request_id})
        assert response.model == RENAMED
        assert served_by(stack, request_id) == [1]
    for k in range(4):
        request_id = f"default-{tag}-{k}"
        short_request(client, request_id)
        assert served_by(stack, request_id) == [0]
    assert sorted(model.id for model in client.models.list()) == sorted([MODEL, RENAMED])
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=2)
    assert MODEL in str(caught.value) and RENAMED in str(caught.value)
