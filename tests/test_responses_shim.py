"""The Responses API's shim side against the fake engine (no model): the exact event stream and its
framing, errors in the API's shape, what is refused, the store (store: false, eviction, a restart,
delete, input items, cancel) and a disconnect cancelling the engine call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common import lazy_module
from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process

openai = lazy_module("openai")  # imported by the first test that uses it

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("responses-store")


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer, store_dir: Path) -> Iterator[str]:
    process, url = start_shim(fake.address, "--responses-store-dir", str(store_dir), "--responses-store-max", "3")
    yield url
    stop_process(process)


@pytest.fixture(scope="module")
def client(shim: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=30) as sdk:
        yield sdk


def raw_events(url: str, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """(the `event:` line, the data) of each event of a streamed /v1/responses."""
    with httpx.stream("POST", f"{url}/v1/responses", json={"model": MODEL_ID, "stream": True, **body},
                      headers=headers, timeout=30) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse_sse(response.read().decode())


def parse_sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, block
        events.append((lines[0][7:], json.loads(lines[1][6:])))
    return events


def check_framing(events: list[tuple[str, dict]]) -> list[dict]:
    """What every Responses stream must hold; returns the data objects."""
    assert all(name == data["type"] for name, data in events)
    data = [d for _, d in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert [d["type"] for d in data[:2]] == ["response.created", "response.in_progress"]
    terminal = [d["type"] for d in data if d["type"] in ("response.completed", "response.incomplete", "response.failed")]
    assert len(terminal) == 1 and data[-1]["type"] == terminal[0]
    # Only the flat error event has a truthy top-level "error" (the SDK raises on any other).
    assert all(not d.get("error") for d in data if d["type"] != "error")
    return data


def test_a_streamed_text_answer_is_the_exact_event_sequence(shim: str) -> None:
    data = check_framing(raw_events(shim, {"input": "hi"}))
    kinds = [d["type"] for d in data]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 5, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    deltas = [d for d in data if d["type"] == "response.output_text.delta"]
    assert {(d["output_index"], d["content_index"]) for d in deltas} == {(0, 0)}
    assert all(d["logprobs"] == [] for d in deltas)
    text = "".join(d["delta"] for d in deltas)
    assert text == "Hello from choice 0." == data[-4]["text"]
    final = data[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == text
    assert final["output"][0] == data[-2]["item"]
    assert final["usage"]["output_tokens"] == 5
    assert data[0]["response"]["status"] == "in_progress" and data[0]["response"]["id"] == final["id"]


def test_a_streamed_call_has_argument_deltas_and_no_content_parts(shim: str) -> None:
    data = check_framing(raw_events(shim, {"input": "tools", "tools": [WEATHER]}))
    kinds = [d["type"] for d in data]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, done = data[2]["item"], data[-2]["item"]
    assert added["type"] == "function_call" and added["status"] == "in_progress" and added["arguments"] == ""
    assert done["call_id"] == "call_fake1" and done["name"] == "get_weather"
    assert done["arguments"] == data[3]["delta"] + data[4]["delta"] == data[5]["arguments"] == '{"city": "Paris"}'
    assert data[-1]["response"]["output"] == [done]


def test_the_sdk_reads_whole_and_streamed_answers(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL_ID, input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    assert whole.status == "completed" and whole.output_text == "Hello from choice 0."
    assert whole.id.startswith("resp_") and whole.output[0].id.startswith("msg_")
    with client.responses.stream(model=MODEL_ID, input="tools", tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id.startswith("call_")


@pytest.mark.parametrize("body", [{"input": "hi"}, {"input": "hi", "max_output_tokens": 2},
                                  {"input": "tools", "tools": [WEATHER]},
                                  {"input": "hi", "top_logprobs": 1, "include": ["message.output_text.logprobs"]}])
def test_a_whole_answer_is_the_streamed_answers_final_object(shim: str, body: dict) -> None:
    """Both come from one writer (a whole answer is the stream's final object): only ids and times differ."""
    def comparable(response: dict) -> dict:
        output = [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]
        return {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at")} | {"output": output}

    whole = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, **body}, timeout=30).json()
    streamed = check_framing(raw_events(shim, body))[-1]["response"]
    assert comparable(whole) == comparable(streamed) and whole["output"]


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI, shim: str) -> None:
    whole = client.responses.create(model=MODEL_ID, input="hi", max_output_tokens=2)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text == "Hello from" and whole.output[0].status == "incomplete"
    data = check_framing(raw_events(shim, {"input": "hi", "max_output_tokens": 2}))
    assert data[-1]["type"] == "response.incomplete"
    assert data[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_engine_failure_mid_stream_is_an_error_then_response_failed(client: openai.OpenAI, shim: str) -> None:
    data = check_framing(raw_events(shim, {"input": "midstream-error"}))
    assert [d["type"] for d in data[-2:]] == ["error", "response.failed"]
    assert data[-2]["code"] and "mid-stream" in data[-2]["message"]
    failed = data[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    with client.responses.stream(model=MODEL_ID, input="midstream-error") as stream:
        kinds = [event.type for event in stream]
    assert kinds[-2:] == ["error", "response.failed"]


def test_logprobs_come_with_the_include_value(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL_ID, input="hi", top_logprobs=2,
                                    include=["message.output_text.logprobs"])
    logprobs = whole.output[0].content[0].logprobs
    assert [e.token for e in logprobs] == ["Hello", " from", " choice", " 0", "."]
    assert all(len(e.top_logprobs) == 2 for e in logprobs)
    plain = client.responses.create(model=MODEL_ID, input="hi", top_logprobs=2)
    assert plain.output[0].content[0].logprobs == []


def test_the_request_reaches_the_engine_as_chat(client: openai.OpenAI) -> None:
    """Items become chat messages (function calls join the assistant turn), tools and formats their
    chat forms; instructions a system message; unknown fields and include values are tolerated."""
    items = [{"role": "developer", "content": "Be brief."},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Rome"}',
              "id": "fc_1", "status": "completed"},
             {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "Sunny"}]},
             {"role": "user", "content": "echo-request"}]
    answer = client.responses.create(
        model=MODEL_ID, input=items, instructions="You are helpful.", tools=[{**WEATHER, "strict": True}],
        tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False, max_output_tokens=50,
        temperature=0.5, top_p=0.9, text={"format": {"type": "json_schema", "name": "x", "strict": True,
                                                     "schema": {"type": "object"}}},
        metadata={"k": "v"}, user="u1", include=["reasoning.encrypted_content"], extra_body={"surprise": 1})
    assert answer.metadata == {"k": "v"} and answer.user == "u1" and answer.instructions == "You are helpful."
    assert answer.tool_choice.name == "get_weather" and answer.parallel_tool_calls is False
    sent = json.loads(answer.output_text)
    roles = [m["role"] for m in sent["chat"]["messages"]]
    assert roles == ["system", "developer", "assistant", "tool", "user"]
    assistant = sent["chat"]["messages"][2]
    assert assistant["content"] == "Hi." and assistant["tool_calls"][0]["id"] == "call_1"
    assert sent["chat"]["messages"][3] == {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}
    assert sent["chat"]["tool_choice"] == {"mode": "MODE_FUNCTION", "function_name": "get_weather"}
    assert sent["chat"]["parallel_tool_calls"] is False
    assert json.loads(sent["constraint"]["json_schema"]) == {"type": "object"}
    assert sent["stopping"]["max_tokens"] == 50


AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
          "tools": [{"type": "function", "name": "spawn_agent", "description": "Start one.",
                     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]}


def test_a_namespace_offers_its_functions_and_its_calls_name_it(client: openai.OpenAI, shim: str) -> None:
    """Codex groups its sub-agent tools in a namespace: the model sees NAMESPACE__NAME, the client gets
    `name` and `namespace` apart (whole, streamed and replayed), and sends them back so in `input`."""
    sent = json.loads(client.responses.create(model=MODEL_ID, input="echo-request", tools=[WEATHER, AGENTS])
                      .output_text)
    assert [(t["name"], t.get("description")) for t in sent["chat"]["tools"]] == [
        ("get_weather", None), ("multi_agent_v1__spawn_agent", "(multi_agent_v1: Sub-agents.) Start one.")]
    body = {"model": MODEL_ID, "input": "tools:multi_agent_v1__spawn_agent", "tools": [AGENTS]}
    whole = client.responses.create(**body)
    assert [(o.type, o.name, o.namespace) for o in whole.output] == [
        ("function_call", "spawn_agent", "multi_agent_v1")]
    events = check_framing(raw_events(shim, {**body, "stream": True}))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["name"], i["namespace"]) for i in done] == [("spawn_agent", "multi_agent_v1")]
    assert events[-1]["response"]["output"] == done
    replayed = parse_sse(httpx.get(f"{shim}/v1/responses/{whole.id}", params={"stream": "true"}).text)
    added = [e["item"] for _, e in replayed if e["type"] == "response.output_item.added"]
    assert [i["namespace"] for i in added] == ["multi_agent_v1"]
    history = [{"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "multi_agent_v1",
                "arguments": "{}"}, {"type": "function_call_output", "call_id": "c1", "output": "ok"},
               {"role": "user", "content": "echo-request"}]
    sent = json.loads(client.responses.create(model=MODEL_ID, input=history, tools=[AGENTS]).output_text)
    assert sent["chat"]["messages"][0]["tool_calls"][0]["name"] == "multi_agent_v1__spawn_agent"


def test_hosted_web_search_is_accepted_and_not_offered(client: openai.OpenAI) -> None:
    """Codex sends web_search by default: this server cannot search, so the model is not offered it; the
    response echoes the tools as sent and a header names what was left out."""
    web = {"type": "web_search", "external_web_access": False}
    raw = client.responses.with_raw_response.create(model=MODEL_ID, input="echo-request", tools=[WEATHER, web])
    sent = json.loads(raw.parse().output_text)
    assert [t["name"] for t in sent["chat"]["tools"]] == ["get_weather"]
    assert raw.headers["conduit-tools-not-offered"] == "web_search"
    assert raw.parse().tools[1].type == "web_search"


def test_allowed_tools_narrow_the_tools_offered(client: openai.OpenAI) -> None:
    other = {**WEATHER, "name": "get_time"}
    answer = client.responses.create(
        model=MODEL_ID, input="echo-request", tools=[WEATHER, other],
        tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]})
    sent = json.loads(answer.output_text)
    assert [t["name"] for t in sent["chat"]["tools"]] == ["get_time"]
    assert sent["chat"]["tool_choice"] == {"mode": "MODE_REQUIRED"}


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "rs_1"}]}, "input[0].type"),  # reasoning items: accepted (issue 44)
    ({"input": "hi", "tools": [{"type": "computer_use_preview"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools[0].vector_store_ids"),  # served: retrieval
    ({"input": "hi", "tools": [WEATHER, {"type": "namespace", "name": "n", "description": "",
                                         "tools": [{"type": "custom", "name": "x"}]}]}, "tools[1].tools[0].type"),
    ({"input": "hi", "tool_choice": {"type": "computer_use_preview"}}, "tool_choice.type"),
    ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice"),  # with no file_search tool
    ({"input": "hi", "tools": [{"type": "function", "name": {"x": 1}, "parameters": {}}]}, "tools[0].name"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "hi", "truncation": "middle"}, "truncation"),
    ({"input": "hi", "metadata": {str(k): "v" for k in range(17)}}, "metadata"),
    ({"input": "hi", "metadata": {"k": "v" * 513}}, "metadata"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({}, "input"),
])
def test_bad_or_unsupported_input_is_a_400_naming_it(shim: str, body: dict, param: str) -> None:
    response = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert "messages" not in error["message"] and "response_format" not in error["message"], error


def test_engine_errors_keep_their_status(shim: str) -> None:
    response = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, "input": "error:RESOURCE_EXHAUSTED:busy"},
                          timeout=30)
    assert response.status_code == 429 and response.headers["retry-after"]
    response = httpx.post(f"{shim}/v1/responses", json={"model": "nope", "input": "hi"}, timeout=30)
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_previous_response_id_chains_input_and_output_but_not_instructions(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL_ID, input="tools", tools=[WEATHER], instructions="Old rules.")
    call = first.output[0]
    second = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, instructions="New rules.",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
               {"role": "user", "content": "echo-request"}])
    messages = json.loads(second.output_text)["chat"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[0]["content"] == "New rules." and messages[2]["tool_calls"][0]["id"] == call.call_id
    assert second.previous_response_id == first.id
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output", "message"]
    assert items[1].id == call.id


def test_unknown_previous_response_id_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=MODEL_ID, input="hi", previous_response_id="resp_nope")
    assert raised.value.body["param"] == "previous_response_id"


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    answer = client.responses.create(model=MODEL_ID, input="hi", store=False)
    assert answer.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)


def test_get_delete_and_replay(client: openai.OpenAI, shim: str) -> None:
    answer = client.responses.create(model=MODEL_ID, input="hi")
    assert client.responses.retrieve(answer.id).output_text == answer.output_text
    replayed = check_framing(parse_sse(httpx.get(f"{shim}/v1/responses/{answer.id}?stream=true", timeout=30).text))
    assert replayed[-1]["response"] == json.loads(answer.model_dump_json(exclude_unset=True)) | replayed[-1]["response"]
    assert "".join(d.get("delta", "") for d in replayed if d["type"] == "response.output_text.delta") == "Hello from choice 0."
    client.responses.delete(answer.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answer.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(answer.id)


def test_the_store_evicts_the_oldest_past_its_bound(client: openai.OpenAI) -> None:
    ids = [client.responses.create(model=MODEL_ID, input="hi").id for _ in range(4)]  # this shim keeps 3
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_the_store_survives_a_restart(fake: FakeEngineServer, tmp_path: Path) -> None:
    process, url = start_shim(fake.address, "--responses-store-dir", str(tmp_path))
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:
            answer = sdk.responses.create(model=MODEL_ID, input="hi")
    finally:
        stop_process(process)
    assert (tmp_path / "responses.sqlite3").exists()
    process, url = start_shim(fake.address, "--responses-store-dir", str(tmp_path))
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as sdk:
            assert sdk.responses.retrieve(answer.id).output_text == "Hello from choice 0."
            chained = sdk.responses.create(model=MODEL_ID, input="echo-request", previous_response_id=answer.id)
            assert len(json.loads(chained.output_text)["chat"]["messages"]) == 3
    finally:
        stop_process(process)


def test_cancel_stops_a_response_in_flight_and_refuses_a_finished_one(client: openai.OpenAI, shim: str,
                                                                    fake: FakeEngineServer) -> None:
    with httpx.stream("POST", f"{shim}/v1/responses", json={"model": MODEL_ID, "stream": True, "input": "hang"},
                      headers={"X-Request-Id": "responses-cancel-1"}, timeout=30) as response:
        lines = response.iter_lines()
        created = None
        for line in lines:
            if line.startswith("data: "):
                created = json.loads(line[6:])
                break
        response_id = created["response"]["id"]
        assert client.responses.retrieve(response_id).status == "in_progress"
        assert client.responses.cancel(response_id).status == "cancelled"
        rest = "\n".join(lines)
    assert fake.engine.wait_cancelled("responses-cancel-1")
    events = [json.loads(line[6:]) for line in rest.split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "cancelled"
    assert client.responses.retrieve(response_id).status == "cancelled"
    finished = client.responses.create(model=MODEL_ID, input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(finished.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")


def test_a_client_that_leaves_cancels_the_engine_call(shim: str, fake: FakeEngineServer) -> None:
    with httpx.stream("POST", f"{shim}/v1/responses", json={"model": MODEL_ID, "stream": True, "input": "long:2000"},
                      headers={"X-Request-Id": "responses-leave-1"}, timeout=30) as response:
        for line in response.iter_lines():
            if '"response.output_text.delta"' in line:
                break
    assert fake.engine.wait_cancelled("responses-leave-1")


def test_metrics_count_the_route(shim: str) -> None:
    text = httpx.get(f"{shim}/metrics", timeout=30).text
    assert 'route="/v1/responses"' in text and 'route="/v1/responses/<response_id>"' in text


def test_a_request_too_large_is_a_413(fake: FakeEngineServer) -> None:
    process, url = start_shim(fake.address, "--max-body-bytes", "1000", "--api-key", "k")
    try:
        assert httpx.post(f"{url}/v1/responses", json={"model": MODEL_ID, "input": "hi"}, timeout=30).status_code == 401
        big = httpx.post(f"{url}/v1/responses", json={"model": MODEL_ID, "input": "x" * 2000},
                         headers={"Authorization": "Bearer k"}, timeout=30)
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    finally:
        stop_process(process)



@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "tools": [WEATHER, {**AGENTS, "tools": [{"type": "function", "name": "a" * 60}]}]},
     "tools[1].tools[0].name"),  # the namespaced name NAMESPACE__NAME is too long
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "", "arguments": "{}"}]}, "input[0].name"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "", "output": "x"}]},
     "input[1].call_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}, {**WEATHER, "parameters": "{"}]}, "tools[1].parameters"),
])
def test_errors_name_the_field_of_the_responses_body(shim: str, body: dict, param: str) -> None:
    """Responses is validated as itself: errors name its own fields, not a chat request's."""
    response = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, **body}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
