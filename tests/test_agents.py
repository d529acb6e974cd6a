"""Claude Code and Codex CLI, installed from npm at pinned versions, run non-interactively against a real
stack on their default settings: only the base URL, the model name and their telemetry are set (plus a
temporary HOME, and a dead proxy for anything but loopback, so nothing reaches a network).

The model is Gemma 3 270M (32k context: the agents' default prompts are ~9-12k tokens) with a plain
turn template. A base model that small cannot drive an agent, so a recording proxy between agent and
shim steers it with the APIs' own fields, as a client setting would: each text answer is pinned by an
answer format (a short JSON, so it ends in a few tokens where the base model would ramble through the
agents' 32000-token budget, which the engine caps to what the context leaves), and for the tool round
trip one call is forced (`tool_choice`) to a tool whose argument is narrowed to one value, then
`none`. The agents' requests pass through otherwise unchanged; the proxy keeps them, and
`CONDUIT_RECORD_AGENT_REQUESTS=1` writes them to tests/agent_requests/ (replayed by the fast tier,
tests/test_agent_requests.py).

`make test-agents` runs this module (minutes of CPU prefill per agent; seconds on a GPU): it is left
out of `make test` unless CONDUIT_AGENT_TESTS=1.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import pytest

from engine_service.model.cache_dir import cache_dir

AGENT_TIMEOUT_S = 3600  # a 12k-token prefill on a busy 2-core machine took ~9 minutes
pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(2 * AGENT_TIMEOUT_S),
              pytest.mark.skipif(os.environ.get("CONDUIT_AGENT_TESTS") != "1",
                                 reason="the agents' end-to-end tests run with `make test-agents`")]

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
CODEX = ("@openai/codex", "0.171.0")
MODEL = "gemma-3-270m-q4_k_m"
RECORDED = Path(__file__).parent / "agent_requests"
TURNS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
# The answer the proxy pins text answers to (Codex treats an answer cut by its budget as a failure).
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["Hello."]}},
                 "required": ["answer"], "additionalProperties": False}
SECRET = "lighthouse-42"


# ------------------------------------------------------------------ installs and the stack


def npm_install(package: str, version: str, binary: str) -> Path:
    """The agent's executable, installed once into the cache (npm from the system's Node packages)."""
    if shutil.which("npm") is None:
        pytest.fail("npm is missing: run `make test-agents` (it installs Debian's nodejs and npm)")
    prefix = cache_dir() / "agents" / f"{package.replace('/', '+')}-{version}"
    executable = prefix / "node_modules" / ".bin" / binary
    if not executable.exists():
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
                        f"{package}@{version}"], check=True, timeout=900)
    return executable


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from launcher.stack import Stack
    from test_model_families import assemble_gemma_gguf

    template = tmp_path_factory.mktemp("template") / "turns.jinja"
    template.write_text(TURNS_TEMPLATE)
    # 20k tokens hold either agent's prompt and its answers; float32 as the families' test serves Gemma.
    flags = ["--dtype", "float32", "--quantization", "none", "--max-model-len", "20000",
             "--chat-template", str(template)]
    with Stack(model=str(assemble_gemma_gguf()), engine_args=flags, startup_timeout=600) as running:
        yield running


# ------------------------------------------------------------------ the steering, recording proxy


@dataclass
class Exchange:
    path: str
    headers: dict[str, str]
    body: Any  # as the agent sent it
    status: int = 0


@dataclass
class Steering:
    """What the proxy changes in each generation request (Messages or Responses)."""

    tool: str | None = None  # forced on the first request, `none` afterwards
    narrow: Callable[[dict], None] | None = None  # narrows the forced tool's schema in place
    exchanges: list[Exchange] = field(default_factory=list)

    def generations(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.startswith(("/v1/messages", "/v1/responses"))
                and "count_tokens" not in e.path]

    def apply(self, path: str, body: dict) -> dict:
        body = json.loads(json.dumps(body))
        messages = path.startswith("/v1/messages")
        if self.tool and len(self.generations()) == 1:
            body["tool_choice"] = {"type": "tool" if messages else "function", "name": self.tool}
            for tool in body.get("tools", []):
                if tool.get("name") == self.tool:
                    self.narrow(tool)
            return body
        body["tool_choice"] = {"type": "none"} if messages else "none"
        if messages:
            body["output_config"] = {**body.get("output_config", {}),
                                     "format": {"type": "json_schema", "schema": ANSWER_SCHEMA}}
        else:
            body["text"] = {**body.get("text", {}),
                            "format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA}}
        return body


def start_proxy(upstream: str, steering: Steering) -> tuple[ThreadingHTTPServer, str]:
    target = urlparse(upstream)

    class Handler(BaseHTTPRequestHandler):
        def _forward(self, body: bytes | None) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length",
                                                                                   "accept-encoding", "connection")}
            exchange = Exchange(self.path, headers, None)
            if body:
                exchange.body = json.loads(body)
                steering.exchanges.append(exchange)
                if isinstance(exchange.body, dict) and exchange.body.get("model"):
                    body = json.dumps(steering.apply(self.path, exchange.body)).encode()
            else:
                steering.exchanges.append(exchange)
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=AGENT_TIMEOUT_S)
            conn.request(self.command, self.path, body, headers)
            answer = conn.getresponse()
            exchange.status = answer.status
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while chunk := answer.read1(65536):  # streamed through as it comes (heartbeats included)
                self.wfile.write(chunk)
                self.wfile.flush()
            conn.close()

        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def proxy(stack: Any) -> Iterator[tuple[Steering, str]]:
    steering = Steering()
    server, url = start_proxy(stack.base_url.removesuffix("/v1"), steering)
    yield steering, url
    server.shutdown()


def offline_env(home: Path) -> dict[str, str]:
    """A temporary HOME, and every proxy variable pointing at a closed port except for loopback."""
    dead = "http://127.0.0.1:9"
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "HTTP_PROXY": dead,
            "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead, "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost"}


def record(name: str, exchange: Exchange) -> None:
    """With CONDUIT_RECORD_AGENT_REQUESTS=1, keep an agent's request for the fast tier's replays."""
    if os.environ.get("CONDUIT_RECORD_AGENT_REQUESTS") != "1":
        return
    keep = ("anthropic-version", "anthropic-beta", "x-app", "user-agent", "originator", "accept")
    headers = {k.lower(): v for k, v in exchange.headers.items() if k.lower() in keep}
    text = json.dumps({"path": exchange.path, "headers": headers, "body": exchange.body}, indent=1, ensure_ascii=False)
    (RECORDED / f"{name}.json").write_text(text + "\n")


def run_agent(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


# ------------------------------------------------------------------ Claude Code


def claude(url: str, workdir: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    executable = npm_install(*CLAUDE_CODE, "claude")
    env = {**offline_env(workdir / "home"), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "unused",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "API_TIMEOUT_MS": str(AGENT_TIMEOUT_S * 1000)}
    (workdir / "home").mkdir(exist_ok=True)
    return run_agent([str(executable), "-p", prompt, "--model", MODEL], env, workdir)


def test_claude_code_prints_an_answer(proxy: tuple[Steering, str], tmp_path: Path) -> None:
    steering, url = proxy
    done = claude(url, tmp_path, "Say hello.")
    sent = steering.generations()
    assert sent and all(e.status == 200 for e in sent), [(e.path, e.status) for e in sent]
    assert sent[0].path == "/v1/messages?beta=true" and sent[0].body["max_tokens"] == 32000
    assert done.stdout.strip()
    record("claude_code_first", sent[0])


def test_claude_code_tool_round_trip(proxy: tuple[Steering, str], tmp_path: Path) -> None:
    """A forced Read of a file in the working folder: its content comes back as a tool_result."""
    steering, url = proxy
    notes = tmp_path / "notes.txt"
    notes.write_text(f"The secret is {SECRET}.\n")
    steering.tool = "Read"
    steering.narrow = lambda tool: tool.update(input_schema={
        "type": "object", "properties": {"file_path": {"type": "string", "enum": [str(notes)]}},
        "required": ["file_path"], "additionalProperties": False})
    done = claude(url, tmp_path, "Read notes.txt and tell me the secret.")
    sent = steering.generations()
    assert len(sent) >= 2 and all(e.status == 200 for e in sent), [(e.path, e.status) for e in sent]
    results = [b for m in sent[1].body["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    assert results and SECRET in json.dumps(results), results
    assert done.stdout.strip()
    record("claude_code_tool_result", sent[1])


# ------------------------------------------------------------------ Codex CLI


def codex(url: str, workdir: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    executable = npm_install(*CODEX, "codex")
    home = workdir / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "conduit"\ncheck_for_update_on_startup = false\n\n'
        f'[model_providers.conduit]\nname = "Conduit"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        f"stream_idle_timeout_ms = {AGENT_TIMEOUT_S * 1000}\n\n[analytics]\nenabled = false\n")
    env = {**offline_env(workdir), "CODEX_HOME": str(home)}
    return run_agent([str(executable), "exec", "--skip-git-repo-check", prompt], env, workdir)


def test_codex_prints_an_answer(proxy: tuple[Steering, str], tmp_path: Path) -> None:
    steering, url = proxy
    done = codex(url, tmp_path, "Say hello.")
    sent = steering.generations()
    assert sent and all(e.status == 200 for e in sent), [(e.path, e.status) for e in sent]
    assert {t["type"] for t in sent[0].body["tools"]} >= {"namespace", "web_search"}
    assert done.stdout.strip()
    record("codex_first", sent[0])


def test_codex_tool_round_trip(proxy: tuple[Steering, str], tmp_path: Path) -> None:
    """A forced exec_command (narrowed to one command) runs, and its output comes back as function_call_output."""
    steering, url = proxy
    (tmp_path / "notes.txt").write_text(f"The secret is {SECRET}.\n")
    steering.tool = "exec_command"
    steering.narrow = lambda tool: tool.update(parameters={
        "type": "object", "properties": {"cmd": {"type": "string", "enum": ["cat notes.txt"]}},
        "required": ["cmd"], "additionalProperties": False})
    done = codex(url, tmp_path, "Show me notes.txt.")
    sent = steering.generations()
    assert len(sent) >= 2 and all(e.status == 200 for e in sent), [(e.path, e.status) for e in sent]
    outputs = [i for i in sent[1].body["input"] if i.get("type") == "function_call_output"]
    assert outputs and SECRET in json.dumps(outputs), sent[1].body["input"][-3:]
    assert done.stdout.strip()
    record("codex_tool_result", sent[1])
