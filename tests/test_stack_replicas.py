"""Two engine replicas (default model) behind one shim, on real processes: failover.

- Requests sharing a long prompt prefix stay on one replica (the shim's cache-aware routing), whose
  prefix cache then serves it (cached_tokens); short prompts are spread over both replicas.
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

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from clients.launch import Stack
from common import MODEL, QUESTION, STORY
from conftest import STARTUP_TIMEOUT_S

pytestmark = pytest.mark.model

WAIT_S = 120.0
STREAMS = 4
STREAM_TOKENS = 96  # long enough to be mid-stream on both replicas when the signal lands
RENAMED = "smol-renamed"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(replicas=2, log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=STARTUP_TIMEOUT_S) as running:
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
