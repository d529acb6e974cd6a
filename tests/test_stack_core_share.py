"""The stack `make run-stack` starts shares the cores by demand (issue 53): beside an idle embedding
engine the chat engine computes on every core, and it runs on its share only while the embedding
engine has work (launcher/stack.py's thread_shares, engine_service/core/core_share.py). Read from the
chat engine's start line and its metrics (conduit:cpu_threads: the torch threads its steps run on now),
on the real models; nothing here is timed."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import STARTUP_TIMEOUT_S
from launcher.stack import Stack, free_port

pytestmark = pytest.mark.model

CORES = len(os.sched_getaffinity(0))
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
PASSAGE = " ".join(["a passage about retrieval, vector stores and the cosine similarity of their embeddings"] * 12)


@pytest.fixture(scope="module")
def shared_stack() -> Iterator[Stack]:
    """The chat model and all-MiniLM-L6-v2 with the threads the launcher gives them (not the tests'
    one thread per engine, conftest.py), the chat engine's metrics on."""
    if CORES < 2:
        pytest.skip("one core: nothing to share")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("CONDUIT_THREADS", raising=False)  # read by Stack() and passed on by start()
        stack = Stack(embedding_model=EMBEDDING_MODEL, metrics_port=free_port(), startup_timeout=STARTUP_TIMEOUT_S)
        stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def cpu_threads(stack: Stack) -> float:
    assert stack.metrics_url
    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == "conduit:cpu_threads")


def chat(client: httpx.Client, max_tokens: int) -> None:
    """One chat completion: the chat engine takes its threads for the next step before each step."""
    model = client.get("/v1/models").json()["data"]
    chat_model = next(m["id"] for m in model if m["id"] != EMBEDDING_MODEL)
    response = client.post("/v1/chat/completions", json={
        "model": chat_model, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": max_tokens,
        "temperature": 0})
    assert response.status_code == 200, response.text


def test_beside_an_idle_embedding_engine_the_chat_engine_computes_on_every_core(shared_stack: Stack) -> None:
    command = shared_stack.engine_command()
    assert command[command.index("--threads") + 1] == str(CORES)  # the fixed split gave it CORES - CORES // 4
    shares = shared_stack.threads
    assert shares is not None and shares.chat == CORES and shares.chat_beside_embedding < CORES
    log = shared_stack.engine_log.read_text()
    assert f"torch threads: {CORES}, {shares.chat_beside_embedding} while the engine sharing the cores" in log
    assert f"torch threads: {shares.embedding}; marks its work in" in shared_stack.embedding_log.read_text()
    with httpx.Client(base_url=shared_stack.shim_url, timeout=120) as client:
        chat(client, max_tokens=8)
    assert cpu_threads(shared_stack) == CORES


def test_the_chat_engine_runs_on_its_share_while_the_embedding_engine_works_then_on_every_core(
        shared_stack: Stack) -> None:
    shares = shared_stack.threads
    assert shares is not None
    stop = threading.Event()
    embedded: list[int] = []

    def embed() -> None:
        with httpx.Client(base_url=shared_stack.shim_url, timeout=300) as client:
            while not stop.is_set():
                response = client.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": [PASSAGE] * 32})
                assert response.status_code == 200, response.text
                embedded.append(len(response.json()["data"]))

    seen: set[float] = set()
    traffic = threading.Thread(target=embed, daemon=True)
    traffic.start()
    deadline = time.monotonic() + 240
    try:
        with httpx.Client(base_url=shared_stack.shim_url, timeout=120) as client:
            while shares.chat_beside_embedding not in seen and time.monotonic() < deadline:
                chat(client, max_tokens=8)
                seen.add(cpu_threads(shared_stack))
    finally:
        stop.set()
        traffic.join(timeout=300)
    assert embedded, "no embedding request was answered"
    assert shares.chat_beside_embedding in seen, f"the chat engine's threads under embedding traffic: {seen}"
    # The embedding engine is idle again: the chat engine's next steps take every core back.
    with httpx.Client(base_url=shared_stack.shim_url, timeout=120) as client:
        while cpu_threads(shared_stack) != CORES and time.monotonic() < deadline + 60:
            time.sleep(0.2)  # past the mark's linger
            chat(client, max_tokens=4)
    assert cpu_threads(shared_stack) == CORES
