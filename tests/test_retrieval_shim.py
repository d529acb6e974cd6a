"""Files, vector stores, search and the Responses API's file_search tool, against the fake engines (no
model): the fake embedder's vectors are bags of words (tests/fake_engine.py word_vector), so a query
finds the passages that share its words. Two API keys are two tenants. The real embedding model's
retrieval is tests/test_retrieval_stack.py's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common import lazy_module
from fake_engine import EMBEDDER_ID, MODEL_ID, FakeEngineServer, start_shim, stop_process
from retrieval_docs import upload_files
from test_responses_shim import check_framing, parse_sse

openai = lazy_module("openai")
KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
MAX_FILE_BYTES = 100_000


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("retrieval-store")


def _start(fake: FakeEngineServer, embedder: FakeEngineServer, store_dir: Path):
    return start_shim(f"{fake.address},{embedder.address}", "--responses-store-dir", str(store_dir),
                      "--retrieval-model", EMBEDDER_ID, "--files-max-bytes", str(MAX_FILE_BYTES),
                      "--api-key", KEY_A, "--api-key", KEY_B)


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer, embedder: FakeEngineServer, store_dir: Path) -> Iterator[str]:
    process, url = _start(fake, embedder, store_dir)
    yield url
    stop_process(process)


def _client(url: str, key: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(shim: str):
    with _client(shim, KEY_A) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def other(shim: str):
    """The second tenant."""
    with _client(shim, KEY_B) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def library(client) -> str:
    """A vector store of the six documents (tests/retrieval_docs.py), ingested."""
    store = client.vector_stores.create(name="library", metadata={"topic": "mixed"})
    batch = client.vector_stores.file_batches.upload_and_poll(vector_store_id=store.id, files=upload_files(),
                                                              poll_interval_ms=50)
    assert batch.status == "completed" and batch.file_counts.completed == 6, batch
    return store.id


def _search(client, store_id: str, query, **params) -> list:
    return client.vector_stores.search(store_id, query=query, **params).data


# ------------------------------------------------------------------ files

def test_files_upload_list_retrieve_content_delete(client, store_dir: Path) -> None:
    first = client.files.create(file=("notes.txt", b"first file"), purpose="assistants")
    second = client.files.create(file=("lines.jsonl", b'{"a": 1}\n'), purpose="batch",
                                 expires_after={"anchor": "created_at", "seconds": 3600})
    assert (first.object, first.bytes, first.filename, first.purpose) == ("file", 10, "notes.txt", "assistants")
    assert second.expires_at == second.created_at + 3600
    assert client.files.retrieve(first.id).filename == "notes.txt"
    assert client.files.content(first.id).read() == b"first file"
    listed = [f.id for f in client.files.list()]
    assert listed.index(second.id) < listed.index(first.id)  # newest first
    assert [f.id for f in client.files.list(purpose="batch")] == [second.id]
    page = client.files.list(order="asc", limit=1, after=first.id)
    assert first.id not in [f.id for f in page.data]
    assert client.files.delete(first.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first.id)
    assert not (store_dir / "files" / first.id).exists() and (store_dir / "files" / second.id).exists()


def test_an_oversized_upload_is_413_and_leaves_nothing(client, store_dir: Path) -> None:
    before = sorted(p.name for p in (store_dir / "files").iterdir())
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("big.txt", b"x" * (MAX_FILE_BYTES + 1)), purpose="assistants")
    assert caught.value.status_code == 413 and caught.value.body["code"] == "file_too_large"
    assert sorted(p.name for p in (store_dir / "files").iterdir()) == before  # no upload half-written


@pytest.mark.parametrize("files, data, param", [
    ({"file": ("a.txt", b"x")}, {"purpose": "nonsense"}, "purpose"),
    ({"file": ("a.txt", b"x")}, {}, "purpose"),
    ({}, {"purpose": "assistants"}, "file"),
    ({"file": ("a.txt", b"x")}, {"purpose": "batch", "expires_after[anchor]": "created_at",
                                 "expires_after[seconds]": "10"}, "expires_after.seconds"),
])
def test_bad_uploads_are_400_naming_the_field(shim: str, files: dict, data: dict, param: str) -> None:
    answer = httpx.post(f"{shim}/v1/files", files=files, data=data, headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_a_json_body_to_files_is_a_400(shim: str) -> None:
    answer = httpx.post(f"{shim}/v1/files", json={"purpose": "assistants"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "file"


# ------------------------------------------------------------------ vector stores

def test_ingestion_reads_each_format_and_search_finds_its_words(client, library: str) -> None:
    files = {f.id: f for f in client.vector_stores.files.list(library)}
    names = {client.files.retrieve(i).filename: f for i, f in files.items()}
    assert all(f.status == "completed" and f.usage_bytes > 0 for f in names.values())
    assert names["volcanoes.md"].chunking_strategy.static.max_chunk_size_tokens == 62  # the fake's window - 2
    store = client.vector_stores.retrieve(library)
    assert store.file_counts.completed == 6 and store.status == "completed" and store.metadata == {"topic": "mixed"}
    for query, expected in [("racket ball court net", "tennis.pdf"), ("satellites orbit gravity", "orbits.html"),
                            ("starter flour dough oven", "sourdough.txt"), ("saxophone trumpet swing", "jazz.txt")]:
        hits = _search(client, library, query)
        assert hits[0].filename == expected, (query, [h.filename for h in hits])
        assert 0 <= hits[-1].score <= hits[0].score <= 1
    content = client.vector_stores.files.content(file_id=names["orbits.html"].id, vector_store_id=library)
    text = "".join(part.text for part in content)
    assert "geostationary" in text and "secret" not in text and "<p>" not in text  # markup and scripts dropped
    chunks = [h for h in _search(client, library, "eruption stratovolcano ash lava", max_num_results=50)
              if h.filename == "volcanoes.md"]
    assert len(chunks) > 3  # the long document's several chunks


def test_unsupported_and_invalid_files_fail_with_last_error(client) -> None:
    store = client.vector_stores.create(name="bad")
    batch = client.vector_stores.file_batches.upload_and_poll(
        vector_store_id=store.id, poll_interval_ms=50,
        files=[("tool.exe", b"MZ\x90\x00"), ("broken.json", b"{not json"), ("ok.txt", b"fine words")])
    assert batch.file_counts.failed == 2 and batch.file_counts.completed == 1
    errors = {client.files.retrieve(f.id).filename: f.last_error for f in client.vector_stores.files.list(store.id)}
    assert errors["tool.exe"].code == "unsupported_file" and errors["broken.json"].code == "invalid_file"
    assert errors["ok.txt"] is None
    failed = client.vector_stores.files.list(store.id, filter="failed")
    assert len(failed.data) == 2


def test_filters_max_results_and_score_threshold(client) -> None:
    store = client.vector_stores.create(name="filtered")
    for k, (year, team) in enumerate([(2020, "red"), (2022, "blue"), (2024, "red")]):
        uploaded = client.files.create(file=(f"report{k}.txt", f"quarterly report number {k} sales".encode()),
                                       purpose="assistants")
        client.vector_stores.files.create_and_poll(file_id=uploaded.id, vector_store_id=store.id,
                                                   attributes={"year": year, "team": team}, poll_interval_ms=50)

    def years(**params) -> list:
        return sorted(h.attributes["year"] for h in _search(client, store.id, "quarterly report sales", **params))

    assert years() == [2020, 2022, 2024]
    assert years(filters={"type": "eq", "key": "team", "value": "red"}) == [2020, 2024]
    assert years(filters={"type": "gt", "key": "year", "value": 2021}) == [2022, 2024]
    assert years(filters={"type": "in", "key": "team", "value": ["blue"]}) == [2022]
    assert years(filters={"type": "and", "filters": [{"type": "eq", "key": "team", "value": "red"},
                                                      {"type": "lt", "key": "year", "value": 2022}]}) == [2020]
    assert years(filters={"type": "or", "filters": [{"type": "eq", "key": "year", "value": 2020},
                                                     {"type": "eq", "key": "year", "value": 2024}]}) == [2020, 2024]
    assert years(filters={"type": "eq", "key": "missing", "value": 1}) == []
    assert len(_search(client, store.id, "quarterly report sales", max_num_results=1)) == 1
    assert len(years(ranking_options={"score_threshold": 0.99})) == 1  # only the first of both rankings scores 1
    assert years(ranking_options={"ranker": "none"}) == [2020, 2022, 2024]
    assert years(ranking_options={"ranker": "none", "score_threshold": 0.99}) == []  # no cosine reaches it
    updated = client.vector_stores.files.update(vector_store_id=store.id, file_id=client.vector_stores.files.list(
        store.id).data[0].id, attributes={"year": 1999})
    assert updated.attributes == {"year": 1999}
    assert years(filters={"type": "lt", "key": "year", "value": 2000}) == [1999]


@pytest.mark.parametrize("body, param", [
    ({"query": ""}, "query"),
    ({"query": []}, "query"),
    ({"query": "x", "filters": {"type": "like", "key": "a", "value": 1}}, "filters"),
    ({"query": "x", "filters": {"type": "in", "key": "a", "value": "not a list"}}, "filters"),
    ({"query": "x", "filters": {"type": "and", "filters": []}}, "filters"),
    ({"query": "x", "max_num_results": 51}, "max_num_results"),
    ({"query": "x", "ranking_options": {"score_threshold": 1.5}}, "ranking_options.score_threshold"),
])
def test_bad_searches_are_400(shim: str, library: str, body: dict, param: str) -> None:
    answer = httpx.post(f"{shim}/v1/vector_stores/{library}/search", json=body,
                        headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_bad_stores_and_ids_are_4xx(client, shim: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve("vs_unknown")
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.search("vs_unknown", query="x")
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.create(file_ids=["file_unknown"])
    with pytest.raises(openai.BadRequestError) as caught:
        client.vector_stores.create(chunking_strategy={"type": "static", "static": {
            "max_chunk_size_tokens": 200, "chunk_overlap_tokens": 150}})
    assert caught.value.body["param"] == "chunking_strategy.static.chunk_overlap_tokens"
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.create(chunking_strategy={"type": "static", "static": {
            "max_chunk_size_tokens": 50, "chunk_overlap_tokens": 0}})


def test_a_store_deleted_mid_ingestion_takes_nothing_from_others(client, embedder: FakeEngineServer,
                                                                  library: str) -> None:
    before = [h.filename for h in _search(client, library, "racket ball court net")]
    doomed = client.vector_stores.create(name="doomed")
    embedder.engine.embed_gate.clear()  # ingestion waits in its Embed call
    try:
        uploaded = client.files.create(file=("late.txt", b"racket ball court net words"), purpose="assistants")
        batch = client.vector_stores.file_batches.create(vector_store_id=doomed.id, file_ids=[uploaded.id])
        assert batch.status == "in_progress" and batch.file_counts.in_progress == 1
        assert client.vector_stores.delete(doomed.id).deleted
    finally:
        embedder.engine.embed_gate.set()
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(doomed.id)
    assert [h.filename for h in _search(client, library, "racket ball court net")] == before
    assert client.files.retrieve(uploaded.id).filename == "late.txt"  # the file itself stays


def test_a_cancelled_batch_ends_cancelled(client, embedder: FakeEngineServer) -> None:
    store = client.vector_stores.create(name="cancelled")
    embedder.engine.embed_gate.clear()
    try:
        ids = [client.files.create(file=(f"c{k}.txt", b"some words"), purpose="assistants").id for k in range(3)]
        batch = client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=ids)
        cancelled = client.vector_stores.file_batches.cancel(batch_id=batch.id, vector_store_id=store.id)
    finally:
        embedder.engine.embed_gate.set()
    assert cancelled.status == "cancelled" and cancelled.file_counts.cancelled == 3, cancelled
    listed = client.vector_stores.file_batches.list_files(batch_id=batch.id, vector_store_id=store.id)
    assert {f.status for f in listed} == {"cancelled"}


def test_a_restart_resumes_ingestion(fake: FakeEngineServer, embedder: FakeEngineServer,
                                     tmp_path: Path) -> None:
    process, url = _start(fake, embedder, tmp_path)
    embedder.engine.embed_gate.clear()
    try:
        with _client(url, KEY_A) as sdk:
            uploaded = sdk.files.create(file=("resume.txt", b"resumed words here"), purpose="assistants")
            store = sdk.vector_stores.create(name="resume", file_ids=[uploaded.id])
        stop_process(process)  # while its file is in progress
    finally:
        embedder.engine.embed_gate.set()
    process, url = _start(fake, embedder, tmp_path)
    try:
        with _client(url, KEY_A) as sdk:
            done = sdk.vector_stores.files.poll(uploaded.id, vector_store_id=store.id, poll_interval_ms=50)
            assert done.status == "completed"
            assert _search(sdk, store.id, "resumed words")[0].filename == "resume.txt"
    finally:
        stop_process(process)


# ------------------------------------------------------------------ tenants

def test_another_key_sees_none_of_a_tenants_things(client, other, library: str) -> None:
    mine = client.files.create(file=("private.txt", b"private words"), purpose="assistants")
    response = client.responses.create(model=MODEL_ID, input="hi")
    for call in (lambda: other.files.retrieve(mine.id), lambda: other.files.content(mine.id),
                 lambda: other.files.delete(mine.id), lambda: other.vector_stores.retrieve(library),
                 lambda: other.vector_stores.search(library, query="racket"),
                 lambda: other.vector_stores.files.list(library), lambda: other.vector_stores.delete(library),
                 lambda: other.vector_stores.create(file_ids=[mine.id]),
                 lambda: other.responses.retrieve(response.id), lambda: other.responses.delete(response.id),
                 lambda: other.responses.create(model=MODEL_ID, input="x", previous_response_id=response.id),
                 lambda: other.responses.create(model=MODEL_ID, input="x", tools=[
                     {"type": "file_search", "vector_store_ids": [library]}])):
        with pytest.raises(openai.NotFoundError):
            call()
    assert mine.id not in [f.id for f in other.files.list()]
    assert library not in [s.id for s in other.vector_stores.list()]
    assert other.files.list(after=mine.id).data == []  # a cursor of another's is no way in
    assert client.files.retrieve(mine.id).filename == "private.txt"
    assert client.responses.retrieve(response.id).id == response.id


# ------------------------------------------------------------------ file_search in /v1/responses

def _tool(store_id: str, **fields) -> dict:
    return {"type": "file_search", "vector_store_ids": [store_id], **fields}


def test_file_search_whole_answer_has_the_call_item_and_cited_answer(client, library: str) -> None:
    response = client.responses.create(model=MODEL_ID, input="search:racket ball court net", tools=[_tool(library)])
    call, message = response.output
    assert call.type == "file_search_call" and call.status == "completed"
    assert call.queries == ["racket ball court net"] and call.results is None  # results only when included
    assert "racket" in response.output_text  # the fake quotes the first passage it was given
    citations = message.content[0].annotations
    assert citations and citations[0].type == "file_citation" and citations[0].filename == "tennis.pdf"
    assert response.usage.input_tokens > 0 and response.status == "completed"
    included = client.responses.create(model=MODEL_ID, input="search:racket ball court net",
                                       tools=[_tool(library, max_num_results=2)],
                                       include=["file_search_call.results"])
    results = included.output[0].results
    assert len(results) <= 2 and results[0].filename == "tennis.pdf" and "racket" in results[0].text


def test_file_search_streamed_events_in_order(shim: str, library: str) -> None:
    with httpx.stream("POST", f"{shim}/v1/responses", headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30,
                      json={"model": MODEL_ID, "stream": True, "input": "search:satellites orbit gravity",
                            "tools": [_tool(library)], "include": ["file_search_call.results"]}) as answer:
        data = check_framing(parse_sse(answer.read().decode()))
    kinds = [d["type"] for d in data]
    assert kinds[2:7] == ["response.output_item.added", "response.file_search_call.in_progress",
                          "response.file_search_call.searching", "response.file_search_call.completed",
                          "response.output_item.done"]
    call_events = [d for d in data if d["type"].startswith("response.file_search_call.")]
    assert {(d["item_id"], d["output_index"]) for d in call_events} == {(data[2]["item"]["id"], 0)}
    assert data[6]["item"]["results"][0]["filename"] == "orbits.html"
    assert "response.output_text.annotation.added" in kinds
    final = data[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["file_search_call", "message"]


def test_forced_file_search_and_chains(client, library: str) -> None:
    # "hi" alone makes the fake answer without a call; forced, the shim's function is the model's only choice.
    forced = client.responses.create(model=MODEL_ID, input="search:jazz saxophone", tools=[_tool(library)],
                                     tool_choice={"type": "file_search"})
    assert forced.output[0].type == "file_search_call"
    assert forced.tool_choice.type == "file_search"
    follow = client.responses.create(model=MODEL_ID, input="thanks", previous_response_id=forced.id,
                                     tools=[_tool(library)])
    assert follow.output_text == "Hello from choice 0."
    items = client.responses.input_items.list(follow.id)
    assert "file_search_call" in [i.type for i in items]  # the chain keeps the call
    replay = httpx.get(f"{client.base_url}responses/{forced.id}", params={"stream": "true"},
                       headers={"Authorization": f"Bearer {KEY_A}"})
    kinds = [d["type"] for _, d in parse_sse(replay.text)]
    assert "response.file_search_call.completed" in kinds
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_ID, input="x", tool_choice={"type": "file_search"})
    assert caught.value.body["param"] == "tool_choice"


def test_agents_sdk_file_search_tool_runs(shim: str, library: str) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(model=MODEL_ID, openai_client=openai.AsyncOpenAI(
        base_url=f"{shim}/v1", api_key=KEY_A, max_retries=0))
    agent = agents.Agent(name="librarian", instructions="Answer from the files.", model=model,
                         tools=[agents.FileSearchTool(vector_store_ids=[library], include_search_results=True)])
    result = agents.Runner.run_sync(agent, "search:starter flour dough oven")
    assert "starter" in result.final_output.lower()
    calls = [item.raw_item for item in result.new_items if getattr(item.raw_item, "type", "") == "file_search_call"]
    assert calls and calls[0].results[0].filename == "sourdough.txt"


def test_the_retrieval_model_defaults_to_a_served_one_that_embeds(embedder: FakeEngineServer) -> None:
    """--retrieval-model auto: not all-MiniLM-L6-v2 here, so the first model whose engine embeds."""
    process, url = start_shim(embedder.address, "--responses-store-dir", ":memory:")
    try:
        with _client(url, "unused") as sdk:
            store = sdk.vector_stores.create(name="auto")
            batch = sdk.vector_stores.file_batches.upload_and_poll(
                vector_store_id=store.id, files=[("auto.txt", b"automatic model choice")], poll_interval_ms=50)
            assert batch.file_counts.completed == 1, batch
            assert _search(sdk, store.id, "automatic choice")[0].filename == "auto.txt"
    finally:
        stop_process(process)


def test_an_expired_store_is_no_longer_searched(client, store_dir: Path) -> None:
    import sqlite3

    store = client.vector_stores.create(name="short-lived", expires_after={"anchor": "last_active_at", "days": 1})
    assert store.expires_at == store.last_active_at + 86400 and store.status == "completed"
    with sqlite3.connect(store_dir / "vector_stores.sqlite3") as db:  # two days pass
        db.execute("UPDATE stores SET last_active_at = last_active_at - 2 * 86400 WHERE id = ?", (store.id,))
    assert client.vector_stores.retrieve(store.id).status == "expired"
    with pytest.raises(openai.BadRequestError) as caught:
        client.vector_stores.search(store.id, query="anything")
    assert caught.value.body["code"] == "vector_store_expired"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_ID, input="x", tools=[_tool(store.id)])
    assert caught.value.body["param"] == "tools[0].vector_store_ids[0]"


def test_a_store_made_with_files_and_a_chunking_strategy_ingests_them(client) -> None:
    """The strategy given beside file_ids (a 500 once: the parsed strategy was parsed again as JSON)."""
    import openai

    uploaded = client.files.create(file=("short.txt", b"Chunked by the store's own strategy."), purpose="assistants")
    strategy = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 50}}
    store = client.vector_stores.create(file_ids=[uploaded.id], chunking_strategy=strategy)
    assert client.vector_stores.files.retrieve(uploaded.id, vector_store_id=store.id).chunking_strategy.static \
        .max_chunk_size_tokens == 100
    batch = client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[uploaded.id],
                                                     chunking_strategy={"type": "auto"})
    assert batch.file_counts.total == 1
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.create(file_ids=["file-none"], chunking_strategy={"type": "auto"})


def test_ingestion_embeds_a_few_chunks_at_a_time_while_chat_streams(client, fake: FakeEngineServer,
                                                                    embedder: FakeEngineServer) -> None:
    """Ingestion is paced while a Generate call is open (http_shim/retrieval/ingest.py)."""
    from concurrent.futures import ThreadPoolExecutor

    from http_shim.retrieval.ingest import PACED_CHUNKS

    text = " ".join(f"word{k}" for k in range(6000)).encode()  # 60 chunks of 100 words
    strategy = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 0}}

    def ingest() -> list[int]:
        before = len(embedder.engine.embed_calls)
        uploaded = client.files.create(file=("paced.txt", text), purpose="assistants")
        store = client.vector_stores.create(file_ids=[uploaded.id], chunking_strategy=strategy)
        while client.vector_stores.files.retrieve(uploaded.id, vector_store_id=store.id).status == "in_progress":
            time.sleep(0.05)
        return embedder.engine.embed_calls[before:]

    running = fake.engine.running
    with ThreadPoolExecutor(1) as pool:
        chat = pool.submit(client.chat.completions.create, model=MODEL_ID,
                           messages=[{"role": "user", "content": "slow:1"}])
        while fake.engine.running == running:
            time.sleep(0.01)
        calls = ingest()
        chat.result()
    assert len(calls) >= 60 // PACED_CHUNKS and max(calls) <= PACED_CHUNKS, calls


@pytest.mark.parametrize("route", ["/v1/files", "/v1/vector_stores", "/v1/batches"])
def test_a_limit_of_non_ascii_digits_is_a_400(shim: str, route: str) -> None:
    """"²" is a digit to str.isdigit() but no int (a 500 once, found by the fuzzer)."""
    answer = httpx.get(f"{shim}{route}", params={"limit": "²"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit", answer.text


def test_other_numbers_of_non_ascii_digits_are_400s(shim: str, client) -> None:
    """The same "²" in a logit_bias key and the Responses API's own list and replay numbers."""
    auth = {"Authorization": f"Bearer {KEY_A}"}
    chat = httpx.post(f"{shim}/v1/chat/completions", headers=auth, json={
        "model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"²": 1}})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "logit_bias"
    response_id = client.responses.create(model=MODEL_ID, input="hi").id
    items = httpx.get(f"{shim}/v1/responses/{response_id}/input_items", headers=auth, params={"limit": "²"})
    assert items.status_code == 400 and items.json()["error"]["param"] == "limit"
    replay = httpx.get(f"{shim}/v1/responses/{response_id}", headers=auth,
                       params={"stream": "true", "starting_after": "²"})
    assert replay.status_code == 400 and replay.json()["error"]["param"] == "starting_after"
