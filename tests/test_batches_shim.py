"""The Batch API against the fake engines (no model), through the openai SDK: its protocol and
validation, the life cycle, cancel, list pages, tenants, and a shim restarted mid-batch losing no
answered request. Each request's answer is compared with the same request sent live. The real model's
batches (chat and embeddings) are tests/test_batches_stack.py's; the engine's priorities are
tests/test_engine_scheduler.py's."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import lazy_module
from conduit.v1 import engine_pb2 as pb
from fake_engine import EMBEDDER_ID, MODEL_ID, FakeEngineServer, start_shim, stop_process

openai = lazy_module("openai")
KEY_A, KEY_B = "batch-tenant-a", "batch-tenant-b"
FINAL = ("failed", "completed", "expired", "cancelled")
# What differs between two answers to one request: ids and clocks.
VOLATILE = {"id", "created", "created_at", "completed_at"}


def _start(fake: FakeEngineServer, embedder: FakeEngineServer, store_dir: Path, *extra: str):
    return start_shim(f"{fake.address},{embedder.address}", "--responses-store-dir", str(store_dir),
                      "--retrieval-model", EMBEDDER_ID, "--api-key", KEY_A, "--api-key", KEY_B, *extra)


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer, embedder: FakeEngineServer, tmp_path_factory) -> Iterator[str]:
    process, url = _start(fake, embedder, tmp_path_factory.mktemp("batch-store"), "--batch-max-in-flight", "2")
    yield url
    stop_process(process)


def _client(url: str, key: str = KEY_A):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(shim: str):
    with _client(shim) as sdk:
        yield sdk


def chat_line(custom_id: str, content: str = "hi", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], **body}}


def upload(client, lines: list[Any] | bytes) -> str:
    data = lines if isinstance(lines, bytes) else b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch").id


def wait(client, batch_id: str, until: Any = lambda b: b.status in FINAL, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        assert time.monotonic() < deadline, f"batch stuck: {batch}"
        time.sleep(0.05)


def run_batch(client, lines: list[Any] | bytes, endpoint: str = "/v1/chat/completions", **params: Any):
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint=endpoint, completion_window="24h",
                                  **params)
    assert batch.status == "validating" and batch.object == "batch"
    return wait(client, batch.id)


def file_lines(client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def stable(body: Any) -> Any:
    """An answer without what differs between two answers to one request."""
    if isinstance(body, dict):
        return {k: stable(v) for k, v in body.items() if k not in VOLATILE}
    if isinstance(body, list):
        return [stable(v) for v in body]
    return body


def live(url: str, endpoint: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import httpx
    answer = httpx.post(f"{url}{endpoint}", json=body, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
    return answer.status_code, answer.json()


# ------------------------------------------------------------------ every endpoint, as live

ENDPOINT_BODIES = {
    "/v1/chat/completions": [{"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                             {"model": MODEL_ID, "messages": [{"role": "user", "content": "unicode"}],
                              "logprobs": True, "top_logprobs": 2},
                             {"model": MODEL_ID, "messages": [{"role": "user", "content": "tools"}], "tools": [
                                 {"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}],
    "/v1/completions": [{"model": MODEL_ID, "prompt": ["one", "two"], "max_tokens": 4}],
    "/v1/embeddings": [{"model": EMBEDDER_ID, "input": ["a cat sat", "dogs bark"]},
                       {"model": EMBEDDER_ID, "input": "base64 please", "encoding_format": "base64"}],
    "/v1/responses": [{"model": MODEL_ID, "input": "hello there", "store": False}],
}


@pytest.mark.parametrize("endpoint", ENDPOINT_BODIES)
def test_each_request_is_answered_as_the_live_endpoint_answers_it(client, shim, fake, embedder, endpoint) -> None:
    bodies = ENDPOINT_BODIES[endpoint]
    embeds_before = len(embedder.engine.embed_priorities)
    bad = {**bodies[0], "model": "no-such-model"}  # the route's own 404, in the error file
    lines = [{"custom_id": f"r{k}", "method": "POST", "url": endpoint, "body": body}
             for k, body in enumerate([*bodies, bad])]
    batch = run_batch(client, lines, endpoint, metadata={"job": "parity"})
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(bodies), "failed": 1}
    assert batch.metadata == {"job": "parity"} and batch.expires_at == batch.created_at + 24 * 3600
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.failed_at is batch.cancelled_at is batch.expired_at is None and batch.errors is None
    outputs, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    assert [line["custom_id"] for line in outputs] == [f"r{k}" for k in range(len(bodies))], "in file order"
    for line, body in zip(outputs, bodies):
        status, answer = live(shim, endpoint, body)
        assert line["response"]["status_code"] == status == 200 and line["error"] is None
        assert stable(line["response"]["body"]) == stable(answer)
        assert line["id"].startswith("batch_req_") and line["response"]["request_id"] == line["id"]
    [error] = errors
    status, answer = live(shim, endpoint, bad)
    assert error["custom_id"] == f"r{len(bodies)}" and error["error"] is None
    assert error["response"]["status_code"] == status == 404 and error["response"]["body"] == answer
    output_file = client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.filename == f"{batch.id}_output.jsonl"
    usage = batch.usage
    assert usage.input_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    # The engines heard the batch's calls at batch priority, the live ones' at interactive priority.
    if endpoint == "/v1/embeddings":
        heard = embedder.engine.embed_priorities[embeds_before:]
        assert heard == [pb.PRIORITY_BATCH] * len(bodies) + [pb.PRIORITY_INTERACTIVE] * len(bodies)
    else:
        batch_calls = [r for r in fake.engine.requests if r.request_id.startswith("batch_req_")]
        live_calls = [r for r in fake.engine.requests if r.request_id.startswith("req_")]
        assert batch_calls and {r.priority for r in batch_calls} == {pb.PRIORITY_BATCH}
        assert live_calls and {r.priority for r in live_calls} == {pb.PRIORITY_INTERACTIVE}


def test_the_objects_are_the_sdks_types_field_for_field(client, shim) -> None:
    """Every field the shim writes is one of the SDK's `Batch` (and `BatchError`, `BatchUsage`), and validates."""
    import httpx
    from openai.types import Batch

    done = run_batch(client, [chat_line("a")])
    failed = run_batch(client, b"nope\n")
    for batch in (done, failed):
        raw = httpx.get(f"{shim}/v1/batches/{batch.id}", headers={"Authorization": f"Bearer {KEY_A}"}).json()
        assert set(raw) == set(Batch.model_fields), set(raw) ^ set(Batch.model_fields)
        parsed = Batch.model_validate(raw)
        for part in ("errors", "usage", "request_counts"):
            value = getattr(parsed, part)
            if value is not None:
                assert set(raw[part]) <= set(type(value).model_fields)
    assert set(raw["errors"]["data"][0]) == {"code", "message", "param", "line"}


def test_usage_sums_the_answers_usage(client) -> None:
    batch = run_batch(client, [chat_line("a", "one two three"), chat_line("b", "four", max_tokens=2)])
    outputs = file_lines(client, batch.output_file_id)
    usages = [line["response"]["body"]["usage"] for line in outputs]
    assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in usages)
    assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in usages)


# ------------------------------------------------------------------ the input file, checked whole

@pytest.mark.parametrize("content, code, line, param", [
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\nnot json\n',
     "invalid_json_line", 2, None),
    (json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}).encode(),
     "missing_required_parameter", 1, "custom_id"),
    ((json.dumps(chat_line("a")) + "\n" + json.dumps(chat_line("a"))).encode(), "duplicate_custom_id", 2, "custom_id"),
    (json.dumps({**chat_line("a"), "url": "/v1/embeddings"}).encode(), "invalid_url", 1, "url"),
    (json.dumps({**chat_line("a"), "method": "GET"}).encode(), "invalid_method", 1, "method"),
    (json.dumps({**chat_line("a"), "body": "text"}).encode(), "invalid_request", 1, "body"),
    (json.dumps(chat_line("a", stream=True)).encode(), "invalid_request", 1, "body.stream"),
    (b"[1, 2]\n", "invalid_request", 1, None),
    (b"\n\n", "empty_file", None, None),
])
def test_a_malformed_input_file_fails_the_batch_naming_the_line(client, content, code, line, param) -> None:
    batch = run_batch(client, content)
    assert batch.status == "failed" and batch.failed_at and batch.in_progress_at is None, batch
    [error] = batch.errors.data
    assert (error.code, error.line, error.param) == (code, line, param) and error.message
    assert batch.output_file_id is batch.error_file_id is None and batch.request_counts.total == 0


def test_an_embeddings_batch_over_50000_inputs_in_all_fails_before_it_runs(client) -> None:
    """OpenAI's cap counts the inputs across the requests (a text, or one list of token ids, is one input)."""
    from http_shim.batches.lines import MAX_EMBEDDING_INPUTS, read_lines

    def lines(count: int, per_line: int) -> bytes:
        body = {"model": EMBEDDER_ID, "input": ["x"] * per_line}
        return "\n".join(json.dumps({"custom_id": f"e{k}", "method": "POST", "url": "/v1/embeddings", "body": body})
                         for k in range(count)).encode()

    assert read_lines(lines(25, 2000), "/v1/embeddings")[1] == [], "at the cap: runs"
    ids = {"custom_id": "t", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBEDDER_ID, "input": [1] * 9}}
    assert read_lines(json.dumps(ids).encode(), "/v1/embeddings")[1] == [], "token ids are one input"
    batch = run_batch(client, lines(25, 2000) + b"\n" + lines(1, 1).replace(b'"e0"', b'"over"'), "/v1/embeddings")
    assert batch.status == "failed" and batch.request_counts.total == 0, batch
    [error] = batch.errors.data
    assert error.code == "too_many_embedding_inputs" and str(MAX_EMBEDDING_INPUTS) in error.message


def test_every_bad_line_is_named(client) -> None:
    lines = [json.dumps(chat_line(f"c{k}")) for k in range(3)] + ["{", json.dumps(chat_line("c1"))]
    batch = run_batch(client, "\n".join(lines).encode())
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", 4), ("duplicate_custom_id", 5)]


@pytest.mark.parametrize("params, status, param", [
    ({"endpoint": "/v1/moderations"}, 400, "endpoint"),
    ({"completion_window": "1h"}, 400, "completion_window"),
    ({"metadata": {"k": 1}}, 400, "metadata"),
    ({"input_file_id": "file-nope"}, 404, "input_file_id"),
])
def test_create_checks_its_fields(client, params, status, param) -> None:
    fields = {"input_file_id": upload(client, [chat_line("a")]), "endpoint": "/v1/chat/completions",
              "completion_window": "24h", **params}
    with pytest.raises(openai.APIStatusError) as raised:
        client.batches.create(**fields)
    assert raised.value.status_code == status and raised.value.body["param"] == param


def test_the_input_file_must_be_a_batch_file_of_the_callers(client, shim) -> None:
    other_purpose = client.files.create(file=("a.jsonl", io.BytesIO(b"{}")), purpose="assistants").id
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        client.batches.create(input_file_id=other_purpose, endpoint="/v1/chat/completions", completion_window="24h")
    with _client(shim, KEY_B) as other, pytest.raises(openai.NotFoundError):
        other.batches.create(input_file_id=upload(client, [chat_line("a")]), endpoint="/v1/chat/completions",
                             completion_window="24h")


def test_another_tenant_sees_none_of_the_batch_nor_its_files(client, shim) -> None:
    batch = run_batch(client, [chat_line("a")])
    with _client(shim, KEY_B) as other:
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(batch.output_file_id)
        assert batch.id not in [b.id for b in other.batches.list()]


# ------------------------------------------------------------------ cancel, list

def test_cancel_stops_new_requests_and_ends_with_the_partial_output(client) -> None:
    lines = [chat_line(f"s{k}", "slow:0.2") for k in range(30)]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at and done.completed_at is None
    outputs = file_lines(client, done.output_file_id)
    assert 2 <= len(outputs) == done.request_counts.completed < 30, "those in flight finished; no new one started"
    assert done.request_counts.total == 30 and done.error_file_id is None
    assert client.batches.cancel(batch.id).status == "cancelled", "cancelling again changes nothing"
    finished = run_batch(client, [chat_line("a")])
    with pytest.raises(openai.BadRequestError, match="already completed"):
        client.batches.cancel(finished.id)


def test_list_pages_newest_first(shim) -> None:
    with _client(shim, KEY_B) as other:  # the second tenant's own batches only
        ids = [run_batch(other, [chat_line("a")]).id for _ in range(3)]
        first = other.batches.list(limit=2)
        assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
        second = other.batches.list(limit=2, after=first.data[-1].id)
        assert [b.id for b in second.data] == [ids[0]] and not second.has_more
        assert [b.id for b in other.batches.list(limit=1)] == ids[::-1], "the SDK's pages, followed"
        with pytest.raises(openai.BadRequestError):
            other.batches.list(limit=101)


def test_unknown_batch_is_a_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.batches.retrieve("batch_nope")
    assert raised.value.body["param"] == "batch_id"


def test_metrics_count_requests_and_batches(client, shim) -> None:
    import httpx
    run_batch(client, [chat_line("a"), chat_line("b", model="no-such-model")])
    text = httpx.get(f"{shim}/metrics").text
    assert 'conduit:batch_requests_total{state="completed"}' in text
    assert 'conduit:batch_requests_total{state="failed"}' in text
    assert 'conduit:batches{status="completed"}' in text and "conduit:batch_requests_waiting 0.0" in text


# ------------------------------------------------------------------ durability

def test_a_shim_restarted_mid_batch_takes_it_up_and_runs_no_answered_request_again(fake, embedder, tmp_path) -> None:
    """Each request is told apart by its system message: the engine must see each exactly once. A second
    shim started on the same store folder meanwhile leaves the batch to the shim that runs it."""
    count = 16
    lines = [{**chat_line(f"d{k}", "slow:0.2"), "body": {"model": MODEL_ID, "messages": [
        {"role": "system", "content": f"durable {k}"}, {"role": "user", "content": "slow:0.2"}]}} for k in range(count)]

    def heard() -> list[str]:
        return [r.chat.messages[0].content for r in fake.engine.requests
                if r.chat.messages and r.chat.messages[0].content.startswith("durable ")]

    process, url = _start(fake, embedder, tmp_path, "--batch-max-in-flight", "2")
    try:
        with _client(url) as sdk:
            batch = sdk.batches.create(input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions",
                                       completion_window="24h")
            wait(sdk, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 1)
            beside, beside_url = _start(fake, embedder, tmp_path, "--batch-max-in-flight", "2")
            with _client(beside_url) as other_shim:
                assert other_shim.batches.retrieve(batch.id).status == "in_progress"
            wait(sdk, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 3)
    finally:
        stop_process(process)  # a drain: the requests in flight finish and are kept
    assert 3 <= len(heard()) < count, "stopped mid-batch"
    process, url = _start(fake, embedder, tmp_path, "--batch-max-in-flight", "2")
    try:
        with _client(url) as sdk:
            done = wait(sdk, batch.id)
            outputs = file_lines(sdk, done.output_file_id)
    finally:
        stop_process(process)
        stop_process(beside)
    assert done.status == "completed" and done.request_counts.completed == count
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"d{k}" for k in range(count))
    assert sorted(heard()) == sorted(f"durable {k}" for k in range(count)), "each request ran once, across the restart"


def test_a_batch_past_its_window_ends_expired_with_its_answers(fake, embedder, tmp_path) -> None:
    """Stopped mid-batch, its expires_at moved to the past in the store (24 hours are not waited for):
    the next start ends it `expired`, the requests not run in the error file as batch_expired."""
    import sqlite3

    lines = [chat_line(f"x{k}", "slow:0.2") for k in range(10)]
    process, url = _start(fake, embedder, tmp_path, "--batch-max-in-flight", "1")
    try:
        with _client(url) as sdk:
            batch = sdk.batches.create(input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions",
                                       completion_window="24h")
            wait(sdk, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 1)
    finally:
        stop_process(process)
    with sqlite3.connect(tmp_path / "batches.sqlite3") as db:
        db.execute("UPDATE batches SET object = json_set(object, '$.expires_at', 1) WHERE id = ?", (batch.id,))
    process, url = _start(fake, embedder, tmp_path)
    try:
        with _client(url) as sdk:
            done = wait(sdk, batch.id)
            outputs, errors = file_lines(sdk, done.output_file_id), file_lines(sdk, done.error_file_id)
    finally:
        stop_process(process)
    assert done.status == "expired" and done.expired_at and done.completed_at is None
    assert 1 <= len(outputs) < 10 and len(outputs) + len(errors) == 10 == done.request_counts.total
    assert done.request_counts.failed == len(errors)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"} and all(e["response"] is None for e in errors)
    assert [line["custom_id"] for line in outputs + errors] == [f"x{k}" for k in range(10)]


def test_a_request_the_engine_refuses_for_a_while_is_tried_again(client, fake) -> None:
    """An engine whose queue is full (429) or that is away (503) gets the request again, with backoff."""
    import grpc

    def calls() -> int:
        return sum(1 for r in fake.engine.requests if r.chat.messages and r.chat.messages[-1].content == "try again")

    fake.engine.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED
    try:
        batch = client.batches.create(input_file_id=upload(client, [chat_line("t", "try again")]),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 30
        while calls() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        fake.engine.refuse = None
    done = wait(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 1 and calls() >= 2
