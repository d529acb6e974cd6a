"""The Batch API on the real default model (the session stack), through the openai SDK: a 300-request
chat batch completes, its answers equal to the live endpoint's at temperature 0, as equal as two live
requests are on the default settings: without --deterministic a request's rounding depends on what it
is batched with (docs/engine.md), so greedy tokens are compared up to a near-tie (common.py). Short
prompts, 2 tokens each, and a live comparison of every 10th request keep its cost low on the shared
cores. The embeddings batch (50 requests) is tests/test_stack_embeddings.py's, on that module's stack
(the session stack serves no embedding model)."""

from __future__ import annotations

import io
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from common import MODEL, RECOMPUTE_LOGPROB_TOLERANCE

pytestmark = pytest.mark.model

LINES = 300
MAX_TOKENS = 2
COMPARED = range(0, LINES, 10)  # the requests also sent live
SUBJECTS = ["cats", "rivers", "bread", "winter", "music", "trains", "paper", "honey", "clouds", "chess"]


def chat_body(k: int) -> dict:
    question = f"In one short sentence, say something about {SUBJECTS[k % len(SUBJECTS)]} and the number {k}."
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_tokens": MAX_TOKENS, "logprobs": True, "top_logprobs": 2}


def run_batch(client, lines: list[dict], endpoint: str, timeout_s: float = 900.0, while_running=None):
    """Uploads the lines, runs them as a batch and waits for its end; the batch and its output lines by custom_id.
    `while_running()` is called at each look at the running batch until it says True."""
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    upload = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h")
    deadline = time.monotonic() + timeout_s
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        if while_running is not None and batch.status == "in_progress" and while_running():
            while_running = None
        assert time.monotonic() < deadline, batch
        time.sleep(0.1 if while_running else 0.5)
        batch = client.batches.retrieve(batch.id)
    outputs = {}
    if batch.output_file_id:
        for text in client.files.content(batch.output_file_id).text.splitlines():
            line = json.loads(text)
            outputs[line["custom_id"]] = line
    return batch, outputs


def assert_same_greedy(live: list[dict], batched: list[dict]) -> None:
    """Chat logprobs of one request answered live and in the batch: the same tokens, logprobs within
    RECOMPUTE_LOGPROB_TOLERANCE, up to the live answer's first near-tie (then they may part)."""
    for k, (ref, got) in enumerate(zip(live, batched)):
        if ref["top_logprobs"][0]["logprob"] - ref["top_logprobs"][1]["logprob"] < RECOMPUTE_LOGPROB_TOLERANCE:
            return
        assert got["token"] == ref["token"], f"token {k} differs before any near-tie"
        assert abs(got["logprob"] - ref["logprob"]) <= RECOMPUTE_LOGPROB_TOLERANCE, f"token {k}'s logprob moved"
    assert len(live) == len(batched)


def engine_metric(metrics_url: str, name: str) -> float:
    """A counter's or gauge's value on the engine (summed over its labels)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) if family.name == name
               for sample in family.samples if sample.name in (name, f"{name}_total"))


def test_a_300_request_chat_batch_answers_as_the_live_endpoint(openai_client, stack) -> None:
    """The live requests go while the batch runs: the batch steps they arrive during give way (the CPU's
    --batch-steps apart) and are run again, which changes no answer."""
    lines = [{"custom_id": f"q{k}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(k)}
             for k in range(LINES)]
    given_way = "conduit:batch_steps_given_way"
    before = engine_metric(stack.metrics_url, given_way)
    asked, running = [], []

    def ask_live() -> bool:
        """Once the batch fills the engine's running batch: the live requests arrive during its steps."""
        running.append(engine_metric(stack.metrics_url, "conduit:num_requests_running"))
        if running[-1] < 8:
            return False
        asked.extend(pool.submit(openai_client.chat.completions.create, **chat_body(k)) for k in COMPARED)
        return True

    with ThreadPoolExecutor(8) as pool:
        batch, outputs = run_batch(openai_client, lines, "/v1/chat/completions", while_running=ask_live)
        assert asked, ("the engine never ran 8 of the batch's requests at once", running)
        live = {k: future.result() for k, future in zip(COMPARED, asked)}
    assert batch.status == "completed" and batch.error_file_id is None, batch
    assert batch.request_counts.completed == LINES and batch.request_counts.failed == 0
    assert batch.usage.output_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"]
                                            for o in outputs.values())
    assert engine_metric(stack.metrics_url, given_way) > before, "no batch step gave way to the live requests"
    for k, answer in live.items():
        line = outputs[f"q{k}"]["response"]
        choice = line["body"]["choices"][0]
        assert line["status_code"] == 200 and line["body"]["usage"]["prompt_tokens"] == answer.usage.prompt_tokens
        assert_same_greedy([t.model_dump() for t in answer.choices[0].logprobs.content], choice["logprobs"]["content"])
