"""The Responses API's mcp tool against the fake engine (no model) and real MCP servers (MCPServer, the
`mcp` package's FastMCP, as processes on loopback: tests/mcp_servers.py): the allowlist, listing (and its
reuse), calls, approvals, failures, secrets, the event stream as the openai SDK types it, the Agents
SDK's HostedMCPTool. The fake engine calls a tool when the input is "call:NAME:ARGS" and answers a tool's
output with "The tool said: OUTPUT" (tests/fake_engine.py). The real model's are test_mcp_stack.py's."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common import lazy_module
from fake_engine import EMBEDDER_ID, MODEL_ID, FakeEngineServer, start_shim, stop_process
from launcher.stack import free_port
from mcp_servers import BIG_CHARS, STATS, Listener, McpServerProcess, Redirector, start_mcp_servers
from test_responses_shim import check_framing, parse_sse

openai = lazy_module("openai")
TOKEN = "tok-3f9a1c7e-unique-secret-d41d8cd9"  # the bearer server's: must appear nowhere the shim writes
HEADER_SECRET = "hdr-secret-7d1e0b5a"
ADD = 'call:add:{"a": 2, "b": 3}'


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, McpServerProcess]]:
    folder = tmp_path_factory.mktemp("mcp-calls")
    started = start_mcp_servers({"http": ("streamable-http", None), "sse": ("sse", None),
                                 "bearer": ("streamable-http", TOKEN)}, folder)
    started |= start_mcp_servers({"doomed": ("streamable-http", None)}, folder)  # its own process: it is stopped
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    sock = Listener()
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def redirector(listener: Listener) -> Iterator[Redirector]:
    server = Redirector(f"http://127.0.0.1:{listener.port}/mcp")  # off the list: never to be followed
    yield server
    server.close()


@pytest.fixture(scope="module")
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/mcp"  # allowed; nothing listens there


@pytest.fixture(scope="module")
def shim_log() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder) / "shim.log"


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer, embedder: FakeEngineServer, servers: dict[str, McpServerProcess], dead_url: str,
         redirector: Redirector, tmp_path_factory: pytest.TempPathFactory, shim_log: Path) -> Iterator[str]:
    allowed = ",".join([*(s.url for s in servers.values()), dead_url, redirector.url])
    with shim_log.open("w") as log:
        process, url = start_shim(f"{fake.address},{embedder.address}", "--retrieval-model", EMBEDDER_ID,
                                  "--responses-store-dir", str(tmp_path_factory.mktemp("store")),
                                  "--log-level", "DEBUG", stderr=log, env={"CONDUIT_MCP_ALLOWED_URLS": allowed})
        yield url
        stop_process(process)


@pytest.fixture(scope="module")
def client(shim: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{shim}/v1", api_key="unused", max_retries=0, timeout=60) as sdk:
        yield sdk


def mcp_tool(server: McpServerProcess | str, label: str = "tools", **fields) -> dict:
    url = server if isinstance(server, str) else server.url
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": "never", **fields}


def _create(client, input: str, tools: list[dict], **params):
    return client.responses.create(model=MODEL_ID, input=input, tools=tools, **params)


def _types(response) -> list[str]:
    return [item.type for item in response.output]


# ------------------------------------------------------------------ the allowlist (no server needed)

@pytest.mark.parametrize("url, allowed", [
    ("http://127.0.0.1:8931/mcp", True),
    ("http://127.0.0.1:8931/mcp/", True),
    ("http://127.0.0.1:8931/mcp/deeper?x=1", True),
    ("HTTP://127.0.0.1:8931/mcp", True),
    ("http://127.0.0.1:8931/mcpx", False),  # not at a path segment's boundary
    ("http://127.0.0.1:8931/", False),
    ("http://127.0.0.1:8931@evil.example/mcp", False),  # userinfo: refused outright
    ("http://user:pw@127.0.0.1:8931/mcp", False),
    ("http://127.0.0.1:89310/mcp", False),
    ("http://127.0.0.1:8932/mcp", False),
    ("https://127.0.0.1:8931/mcp", False),
    ("http://127.0.0.1:8931/mcp/../admin", False),
    ("http://127.0.0.1:8931/mcp/%2e%2e/admin", False),
    ("http://127.0.0.1:8931\\@evil/mcp", False),
    ("ftp://127.0.0.1:8931/mcp", False),
    ("https://mcp.example.com/tools/x", True),
    ("https://mcp.example.com:443/tools", True),  # the default port, spelled
    ("https://MCP.example.com/tools", True),
    ("https://mcp.example.com.evil/tools", False),
    ("http://[::1]:9000/a", True),
    ("http://[::1]:9001/a", False),
])
def test_the_allowlist_compares_parsed_urls(url: str, allowed: bool) -> None:
    from http_shim.mcp.allowlist import AllowedUrls, NotAllowed

    allow = AllowedUrls.of(["http://127.0.0.1:8931/mcp, https://mcp.example.com/tools/", "http://[::1]:9000/"])
    if allowed:
        allow.match(url)
    else:
        with pytest.raises(NotAllowed):
            allow.match(url)


@pytest.mark.parametrize("entry", ["http://u:p@127.0.0.1/", "ftp://x/", "http:///nohost", "http://h:99999/"])
def test_a_bad_allowlist_entry_stops_the_shim(entry: str) -> None:
    from http_shim.options import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--mcp-allowed-urls", entry])


def test_the_tool_is_refused_until_an_operator_allows_servers(fake: FakeEngineServer, listener: Listener) -> None:
    process, url = start_shim(fake.address, "--responses-store-dir", ":memory:")
    try:
        answer = httpx.post(f"{url}/v1/responses", json={"model": MODEL_ID, "input": "hi", "tools": [
            {"type": "function", "name": "f"}, mcp_tool(f"http://127.0.0.1:{listener.port}/mcp")]}, timeout=30)
    finally:
        stop_process(process)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "tools[1].server_url" and error["type"] == "invalid_request_error"
    assert "--mcp-allowed-urls" in error["message"] and "CONDUIT_MCP_ALLOWED_URLS" in error["message"]
    assert listener.accepted == 0


@pytest.mark.parametrize("path", ["/mcp", "/other", ""])
def test_a_server_off_the_list_is_refused_without_a_connection(shim: str, listener: Listener, path: str) -> None:
    for url in (f"http://127.0.0.1:{listener.port}{path}", f"http://127.0.0.1:{listener.port}@127.0.0.1{path}"):
        answer = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, "input": "hi",
                                                          "tools": [mcp_tool(url)]}, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "tools[0].server_url"
        assert "--mcp-allowed-urls" in answer.json()["error"]["message"]
    assert listener.accepted == 0


def test_a_redirect_is_not_followed(client, redirector: Redirector, listener: Listener) -> None:
    response = _create(client, "hello", [mcp_tool(redirector.url)])
    assert response.status == "completed" and _types(response) == ["mcp_list_tools", "message"]
    assert redirector.requests >= 1 and listener.accepted == 0
    assert "redirect" in response.output[0].error


def test_bad_mcp_tools_are_400(shim: str, servers) -> None:
    for tool, param in (({"type": "mcp", "server_label": "x"}, "tools[0].server_url"),
                        ({**mcp_tool(servers["http"]), "server_label": "bad label"}, "tools[0].server_label"),
                        ({**mcp_tool(servers["http"]), "require_approval": "sometimes"}, "tools[0].require_approval")):
        answer = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, "input": "hi", "tools": [tool]},
                            timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


# ------------------------------------------------------------------ listing and calling

@pytest.mark.parametrize("name", ["http", "sse"])
def test_a_forced_call_lists_calls_and_answers(client, servers, name: str) -> None:
    server = servers[name]
    before = len(server.calls())
    response = _create(client, ADD, [mcp_tool(server, allowed_tools=["add", "facts"])],
                       tool_choice={"type": "mcp", "server_label": "tools", "name": "add"})
    assert response.status == "completed" and _types(response) == ["mcp_list_tools", "mcp_call", "message"]
    listing, call, message = response.output
    assert type(listing).__name__ == "McpListTools" and listing.server_label == "tools" and listing.error is None
    assert sorted(t.name for t in listing.tools) == ["add", "facts"]  # allowed_tools filtered the listing
    assert listing.tools[0].input_schema["type"] == "object"
    assert type(call).__name__ == "McpCall" and call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert call.output == "5" and call.error is None and call.status == "completed"
    assert message.content[0].text == "The tool said: 5"
    assert server.calls()[before:] == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]


def test_the_streamed_events_are_openais(shim: str, client, servers) -> None:
    with client.responses.stream(model=MODEL_ID, input=ADD, tools=[mcp_tool(servers["http"])]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added", "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    # The SDK parsed each into its own type (an unknown event would be its base class).
    names = {type(e).__name__ for e in events if "mcp" in e.type}
    assert names == {"ResponseMcpListToolsInProgressEvent", "ResponseMcpListToolsCompletedEvent",
                     "ResponseMcpCallInProgressEvent", "ResponseMcpCallArgumentsDeltaEvent",
                     "ResponseMcpCallArgumentsDoneEvent", "ResponseMcpCallCompletedEvent"}
    call_events = [e for e in events if e.type.startswith("response.mcp_call")]
    assert {(e.item_id, e.output_index) for e in call_events} == {(final.output[1].id, 1)}
    assert "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta") == '{"a": 2, "b": 3}'
    assert final.output[1].output == "5" and final.output[2].content[0].text == "The tool said: 5"
    replayed = check_framing(parse_sse(httpx.get(f"{shim}/v1/responses/{final.id}?stream=true", timeout=30).text))
    assert [d["type"] for d in replayed if "mcp" in d["type"]] == [k for k in kinds if "mcp" in k][:3] + [
        "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "response.mcp_call.completed"]


def test_a_conversation_reuses_its_listing(client, servers) -> None:
    first = _create(client, "hello", [mcp_tool(servers["http"])])
    assert _types(first) == ["mcp_list_tools", "message"]
    second = _create(client, ADD, [mcp_tool(servers["http"])], previous_response_id=first.id)
    assert _types(second) == ["mcp_call", "message"] and second.output[0].output == "5"


def test_mcp_beside_a_function_tool(client, servers, fake: FakeEngineServer) -> None:
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    tools = [weather, mcp_tool(servers["http"], "a", allowed_tools=["add"]),
             mcp_tool(servers["sse"], "b", allowed_tools=["add", "facts"], server_description="census data")]
    response = _create(client, "tools:get_weather", tools)
    # Both servers listed (at once), in the tools' order; the client's call ends the response.
    assert _types(response) == ["mcp_list_tools", "mcp_list_tools", "function_call"]
    assert [i.server_label for i in response.output[:2]] == ["a", "b"]
    sent = fake.engine.requests[-1].chat
    assert [t.name for t in sent.tools] == ["get_weather", "add", "b__add", "facts"]  # a clash: LABEL__NAME
    assert sent.tools[3].description.startswith("(b: census data) ")
    called = _create(client, 'call:b__add:{"a": 1, "b": 1}', tools)
    assert called.output[2].type == "mcp_call" and called.output[2].server_label == "b"
    assert called.output[2].name == "add" and called.output[2].output == "2"


def test_mcp_beside_file_search_shares_max_tool_calls(client, servers, fake: FakeEngineServer) -> None:
    store = client.vector_stores.create(name="lights")
    batch = client.vector_stores.file_batches.upload_and_poll(
        vector_store_id=store.id, files=[("keepers.txt", b"The lighthouse keeper climbs the tower stairs at dusk.")],
        poll_interval_ms=50)
    assert batch.file_counts.completed == 1
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    tools = [{"type": "file_search", "vector_store_ids": [store.id]}, mcp_tool(servers["http"], allowed_tools=["add"]),
             weather]
    searched = _create(client, "search:lighthouse keeper tower", tools, max_tool_calls=1)
    assert _types(searched) == ["mcp_list_tools", "file_search_call", "message"]
    assert "lighthouse" in searched.output_text
    first, after = fake.engine.requests[-2].chat, fake.engine.requests[-1].chat
    assert [t.name for t in first.tools] == ["file_search", "add", "get_weather"]
    assert [t.name for t in after.tools] == ["get_weather"]  # one hosted call allowed: MCP's tools went too
    called = _create(client, ADD, tools, previous_response_id=searched.id)
    assert _types(called) == ["mcp_call", "message"] and called.output[0].output == "5"


def test_max_tool_calls_bounds_the_calls(client, servers, fake: FakeEngineServer) -> None:
    for limit, offered_after in ((None, []), (2, ["add"])):
        response = _create(client, ADD, [mcp_tool(servers["http"], allowed_tools=["add"])],
                           **({"max_tool_calls": limit} if limit else {}))
        assert _types(response) == ["mcp_list_tools", "mcp_call", "message"]
        assert [t.name for t in fake.engine.requests[-1].chat.tools] == offered_after  # the round after the call


def test_a_failing_tool_is_an_mcp_call_error(client, servers) -> None:
    with client.responses.stream(model=MODEL_ID, input="call:boom:{}", tools=[mcp_tool(servers["http"])]) as stream:
        kinds = [e.type for e in stream]
        response = stream.get_final_response()
    assert "response.mcp_call.failed" in kinds and "response.mcp_call.completed" not in kinds
    assert response.status == "completed" and _types(response) == ["mcp_list_tools", "mcp_call", "message"]
    call = response.output[1]
    assert call.status == "failed" and call.output is None
    assert call.error.type == "mcp_tool_execution_error" and "boom" in json.dumps(call.error.content)
    assert "The tool said: The tool call failed" in response.output[2].content[0].text


def test_a_dead_server_is_a_listing_error(client, dead_url: str) -> None:
    with client.responses.stream(model=MODEL_ID, input="hello", tools=[mcp_tool(dead_url)]) as stream:
        kinds = [e.type for e in stream]
        response = stream.get_final_response()
    assert "response.mcp_list_tools.failed" in kinds and response.status == "completed"
    assert _types(response) == ["mcp_list_tools", "message"]
    assert response.output[0].tools == [] and "could not be reached" in response.output[0].error


def test_a_server_gone_mid_conversation_is_a_call_error(client, servers) -> None:
    server = servers["doomed"]
    first = _create(client, "hello", [mcp_tool(server)])
    server.stop()
    second = _create(client, ADD, [mcp_tool(server)], previous_response_id=first.id)
    assert second.status == "completed" and _types(second) == ["mcp_call", "message"]
    assert second.output[0].status == "failed"
    assert second.output[0].error.type == "http_error" and second.output[0].error.code == 502


def test_a_hung_server_times_out_and_a_slow_call_keeps_the_stream_alive(fake: FakeEngineServer, servers) -> None:
    hung = Listener(hold=True)
    allowed = f"http://127.0.0.1:{hung.port}/,{servers['http'].url}"
    process, url = start_shim(fake.address, "--responses-store-dir", ":memory:", "--mcp-call-timeout", "1.0",
                              "--heartbeat-interval", "0.1", env={"CONDUIT_MCP_ALLOWED_URLS": allowed})
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as sdk:
            response = _create(sdk, "hello", [mcp_tool(f"http://127.0.0.1:{hung.port}/mcp")])
        slow = httpx.post(f"{url}/v1/responses", timeout=60, json={
            "model": MODEL_ID, "stream": True, "input": 'call:sleepy:{"seconds": 0.5}',
            "tools": [mcp_tool(servers["http"], allowed_tools=["sleepy"])]}).text
    finally:
        stop_process(process)
        hung.close()
    assert hung.accepted >= 1 and response.status == "completed"
    assert _types(response) == ["mcp_list_tools", "message"] and "in time" in response.output[0].error
    # While the call runs, heartbeats (SSE comments) keep the stream alive.
    running = slow[slow.index("response.mcp_call_arguments.done"):slow.index("event: response.mcp_call.completed")]
    assert "\n:" in running or running.startswith(":")
    check_framing(parse_sse(slow))


def test_a_long_output_is_cut_with_a_note(client, servers) -> None:
    response = _create(client, "call:big:{}", [mcp_tool(servers["http"])])
    output = response.output[1].output
    assert output.startswith("x" * 1000) and len(output) < BIG_CHARS and "[truncated by the server:" in output


# ------------------------------------------------------------------ approvals

def test_approval_is_asked_by_default_and_nothing_is_called_until_approved(client, servers) -> None:
    server = servers["sse"]
    before = len(server.calls())
    tool = mcp_tool(server)
    del tool["require_approval"]  # OpenAI's default: ask
    asked = _create(client, 'call:facts:{"topic": "lighthouses"}', [tool])
    assert asked.status == "completed" and _types(asked) == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    assert type(request).__name__ == "McpApprovalRequest" and request.name == "facts"
    assert json.loads(request.arguments) == {"topic": "lighthouses"}
    assert len(server.calls()) == before  # asked, not called

    denied = _create(client, [{"type": "mcp_approval_response", "approval_request_id": request.id,
                               "approve": False}], [tool], previous_response_id=asked.id)
    assert _types(denied) == ["message"] and "did not approve" in denied.output[0].content[0].text
    assert len(server.calls()) == before

    approved = _create(client, [{"type": "mcp_approval_response", "approval_request_id": request.id,
                                 "approve": True}], [tool], previous_response_id=asked.id)
    assert _types(approved) == ["mcp_call", "message"]
    call = approved.output[0]
    assert call.approval_request_id == request.id and call.output == STATS
    assert approved.output[1].content[0].text == f"The tool said: {STATS}"
    assert server.calls()[before:] == [{"tool": "facts", "arguments": {"topic": "lighthouses"}}]


def test_an_approval_filter_asks_only_for_the_tools_it_names(client, servers) -> None:
    policy = {"never": {"tool_names": ["add"]}}
    called = _create(client, ADD, [mcp_tool(servers["http"], require_approval=policy)])
    assert _types(called) == ["mcp_list_tools", "mcp_call", "message"]
    asked = _create(client, 'call:facts:{"topic": "x"}', [mcp_tool(servers["http"], require_approval=policy)])
    assert _types(asked) == ["mcp_list_tools", "mcp_approval_request"]


def test_an_unknown_approval_is_400(shim: str, servers) -> None:
    first = httpx.post(f"{shim}/v1/responses", json={"model": MODEL_ID, "input": "hi",
                                                     "tools": [mcp_tool(servers["http"])]}, timeout=30).json()
    answer = httpx.post(f"{shim}/v1/responses", json={
        "model": MODEL_ID, "previous_response_id": first["id"], "tools": [mcp_tool(servers["http"])],
        "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}]},
        timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input[0].approval_request_id"
    without = httpx.post(f"{shim}/v1/responses", json={
        "model": MODEL_ID, "previous_response_id": first["id"],
        "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}]},
        timeout=30)
    assert without.status_code == 400 and without.json()["error"]["param"] == "input[0]"


# ------------------------------------------------------------------ secrets

def test_secrets_reach_the_server_only(shim: str, client, servers, shim_log: Path) -> None:
    server = servers["bearer"]
    refused = _create(client, ADD, [mcp_tool(server)])
    assert refused.output[0].error and "401" in refused.output[0].error  # no token: the server said 401
    tool = mcp_tool(server, authorization=TOKEN, headers={"X-Extra": HEADER_SECRET})
    response = _create(client, ADD, [tool])
    assert response.output[1].output == "5" and server.calls()[-1]["tool"] == "add"
    stored = httpx.get(f"{shim}/v1/responses/{response.id}", timeout=30)
    replayed = httpx.get(f"{shim}/v1/responses/{response.id}?stream=true", timeout=30)
    items = httpx.get(f"{shim}/v1/responses/{response.id}/input_items", timeout=30)
    echoed = response.model_dump_json()
    for text in (stored.text, replayed.text, items.text, echoed):
        assert TOKEN not in text and HEADER_SECRET not in text
    assert stored.json()["tools"][0]["server_url"] == server.url
    assert "authorization" not in stored.json()["tools"][0] and "headers" not in stored.json()["tools"][0]
    metrics = httpx.get(f"{shim}/metrics", timeout=30).text
    assert 'conduit:mcp_calls_total{operation="call_tool",outcome="ok",server_label="tools"}' in metrics
    assert TOKEN not in shim_log.read_text() and HEADER_SECRET not in shim_log.read_text()
