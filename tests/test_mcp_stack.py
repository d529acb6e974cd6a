"""The mcp tool of /v1/responses on the real default model (SmolLM2-135M), against real MCP servers
(tests/mcp_servers.py): a shim of its own (its allowlist names the servers) in front of the session
stack's engine. The model is made to call a tool by tool_choice; on `auto` it does what it does, and the
protocol is checked whatever it chose. The protocol's details are test_mcp_shim.py's (fake engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from common import MODEL, lazy_module
from fake_engine import start_shim, stop_process
from launcher.stack import Stack
from mcp_servers import STATS, McpServerProcess, start_mcp_servers

pytestmark = pytest.mark.model
openai = lazy_module("openai")
QUESTION = "How many lighthouses did the 2026 lighthouse census count? Use the facts tool."


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, McpServerProcess]]:
    started = start_mcp_servers({"http": ("streamable-http", None), "sse": ("sse", None)},
                                tmp_path_factory.mktemp("mcp-calls"))
    yield started
    started["http"].stop()


@pytest.fixture(scope="module")
def client(stack: Stack, servers: dict[str, McpServerProcess]) -> Iterator[openai.OpenAI]:
    allowed = ",".join(s.url for s in servers.values())
    process, url = start_shim(stack.engine_address, "--responses-store-dir", ":memory:",
                              env={"CONDUIT_MCP_ALLOWED_URLS": allowed})
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as sdk:
        yield sdk
    stop_process(process)


def _tool(server: McpServerProcess, **fields) -> dict:
    return {"type": "mcp", "server_label": "census", "server_url": server.url, "allowed_tools": ["facts"],
            "require_approval": "never", **fields}


FORCED = {"type": "mcp", "server_label": "census", "name": "facts"}


def test_a_forced_call_gets_the_output_into_the_answer(client, servers) -> None:
    server = servers["http"]
    response = client.responses.create(model=MODEL, input=QUESTION, tools=[_tool(server)], tool_choice=FORCED,
                                       temperature=0, max_output_tokens=40)
    assert [i.type for i in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = response.output[1]
    assert call.status == "completed" and call.output == STATS and isinstance(json.loads(call.arguments), dict)
    assert server.calls()[-1]["tool"] == "facts"
    assert "4211" in response.output[2].content[0].text


def test_streamed_over_sse_with_an_approval(client, servers) -> None:
    server = servers["sse"]
    tool = _tool(server, require_approval="always")
    with client.responses.stream(model=MODEL, input=QUESTION, tools=[tool], tool_choice=FORCED, temperature=0,
                                 max_output_tokens=40) as stream:
        kinds = [e.type for e in stream]
        asked = stream.get_final_response()
    assert [i.type for i in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    assert "response.mcp_list_tools.completed" in kinds and kinds[-1] == "response.completed"
    assert server.calls() == []  # nothing is called before the approval
    request = asked.output[1]
    with client.responses.stream(model=MODEL, previous_response_id=asked.id, tools=[tool], temperature=0,
                                 max_output_tokens=40,
                                 input=[{"type": "mcp_approval_response", "approval_request_id": request.id,
                                         "approve": True}]) as stream:
        kinds = [e.type for e in stream]
        answered = stream.get_final_response()
    assert [i.type for i in answered.output] == ["mcp_call", "message"]
    assert answered.output[0].approval_request_id == request.id and answered.output[0].output == STATS
    assert kinds.index("response.mcp_call.completed") < kinds.index("response.output_text.delta")
    assert [c["tool"] for c in server.calls()] == ["facts"]


def test_automatic_tool_use_keeps_the_protocol(client, servers) -> None:
    server = servers["http"]
    before = len(server.calls())
    response = client.responses.create(model=MODEL, input=QUESTION, tools=[_tool(server)], temperature=0,
                                       max_output_tokens=40)
    assert response.status in ("completed", "incomplete")
    kinds = [i.type for i in response.output]
    assert kinds[0] == "mcp_list_tools" and kinds[-1] == "message"
    calls = [i for i in response.output if i.type == "mcp_call"]
    assert all(c.status in ("completed", "failed") for c in calls)
    assert len(server.calls()) - before == len(calls) <= 1  # max_tool_calls unset: one call at most


def test_the_agents_sdk_hosted_mcp_tool(client, servers) -> None:
    import agents

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(MODEL, openai.AsyncOpenAI(base_url=str(client.base_url), api_key="unused",
                                                                   max_retries=0, timeout=300))
    tool = agents.HostedMCPTool(tool_config=_tool(servers["http"]))
    agent = agents.Agent(name="census", model=model, tools=[tool],
                         model_settings=agents.ModelSettings(tool_choice="facts", temperature=0, max_tokens=40))
    result = agents.Runner.run_sync(agent, QUESTION, max_turns=2)
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["mcp_list_tools_item", "tool_call_item"]
    assert result.new_items[1].raw_item.type == "mcp_call" and result.new_items[1].raw_item.output == STATS
    assert isinstance(result.final_output, str) and servers["http"].calls()[-1]["tool"] == "facts"
