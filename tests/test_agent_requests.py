"""The coding agents' real requests, replayed against the shim and the fake engine: Claude Code's
(Messages, `?beta=true`) and Codex CLI's (Responses), each first request and the one carrying a tool's
result, with every field the agents send on their default settings (tests/agent_requests/, recorded by
tests/test_agents.py from the pinned versions it installs). Each gets a 200 and a well-formed stream, so
a later change cannot refuse them silently."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process
from test_responses_shim import check_framing, parse_sse
from test_shim_http import post
from test_shim_messages import events_of

RECORDED = Path(__file__).parent / "agent_requests"
CLAUDE_CODE = sorted(RECORDED.glob("claude_code_*.json"))
CODEX = sorted(RECORDED.glob("codex_*.json"))


@pytest.fixture(scope="module")
def shim(fake: FakeEngineServer) -> Iterator[str]:
    process, url = start_shim(fake.address, "--api-key", "agent-key")
    yield url
    stop_process(process)


def replay(shim: str, path: Path, auth: dict[str, str]) -> tuple[int, dict, bytes, dict]:
    recorded = json.loads(path.read_text())
    body = {**recorded["body"], "model": MODEL_ID}
    status, headers, raw = post(shim, recorded["path"], body, {**recorded["headers"], **auth})
    return status, headers, raw, recorded["body"]


def test_the_recordings_hold_what_the_issue_names() -> None:
    """The fields the shim once refused are in the recordings (so the replays below prove something)."""
    claude = json.loads(CLAUDE_CODE[0].read_text())["body"]
    assert claude["thinking"]["type"] == "adaptive" and claude["max_tokens"] == 32000
    assert "context_management" in claude and "effort" in claude["output_config"]
    assert any(m["role"] == "system" for m in claude["messages"])
    codex = json.loads(CODEX[0].read_text())["body"]
    assert {t["type"] for t in codex["tools"]} >= {"namespace", "web_search"}
    assert codex["store"] is False and codex["include"] == ["reasoning.encrypted_content"]
    assert any(i.get("role") == "developer" for i in codex["input"])


@pytest.mark.parametrize("path", CLAUDE_CODE, ids=lambda p: p.stem)
def test_claude_code_requests_stream_a_message(shim: str, fake: FakeEngineServer, path: Path) -> None:
    status, headers, raw, sent = replay(shim, path, {"x-api-key": "agent-key"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw[:500]
    names = [name for name, _ in events_of(raw) if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert "content_block_delta" in names
    request = fake.engine.requests[-1]
    roles = [m.role for m in request.chat.messages]
    assert roles[0] == "system" and roles.count("system") == 1  # the turns' system messages folded in
    offered = {t.name for t in request.chat.tools}
    assert offered == {t["name"] for t in sent["tools"] if not t.get("defer_loading")}


@pytest.mark.parametrize("path", CODEX, ids=lambda p: p.stem)
def test_codex_requests_stream_a_response(shim: str, fake: FakeEngineServer, path: Path) -> None:
    status, headers, raw, sent = replay(shim, path, {"Authorization": "Bearer agent-key"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw[:500]
    assert headers["conduit-tools-not-offered"] == "web_search"
    events = check_framing(parse_sse(raw.decode()))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["store"] is False and events[-1]["response"]["output"]
    offered = {t.name for t in fake.engine.requests[-1].chat.tools}
    functions = {t["name"] for t in sent["tools"] if t["type"] == "function"}
    grouped = {f"{t['name']}__{f['name']}" for t in sent["tools"] if t["type"] == "namespace" for f in t["tools"]}
    assert offered == functions | grouped
