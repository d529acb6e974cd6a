"""Readiness with several engines (docs/operations.md#operating-the-shim): the shim's /health is 200 only
once every engine has said what it serves, so that /v1/models is whole, and every model listed has an
engine serving it now; a replica down leaves its model ready while another replica serves it. The
launcher says a stack is up only then: here a stack of fake engines whose chat engine listens seconds
after the others, as a real one that loads its model first.
"""

from __future__ import annotations

import json
import sys
import time

from fake_engine import MODEL_ID, REPO_ROOT, FakeEngineServer, start_shim, stop_process
from launcher.stack import Stack, free_port
from test_shim_http import request

EMBEDDER = "fake-embedder"
SETTLE_S = 10.0  # bound on a replica's poll noticing a change (every 0.25 s, its reconnects within ~2 s)


def health(url: str) -> tuple[int, dict]:
    status, _, body = request(url, "GET", "/health")
    return status, json.loads(body)


def listed(url: str) -> list[str]:
    status, _, body = request(url, "GET", "/v1/models")
    assert status == 200, body
    return sorted(model["id"] for model in json.loads(body)["data"])


def wait_until(condition, timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_health_waits_until_every_engine_has_said_what_it_serves():
    embedder = FakeEngineServer(model_id=EMBEDDER).start()
    chat_address = f"127.0.0.1:{free_port()}"  # its engine still loading: nothing listens there yet
    shim, url = start_shim(f"{embedder.address},{chat_address}")
    chat = None
    try:
        for _ in range(3):  # before: 200 at once, every model it knew of (the embedder's) being served
            status, body = health(url)
            assert status == 503, body
            assert body["engine"] == body["engines"][chat_address] == "UNREACHABLE"
            time.sleep(0.1)
        assert listed(url) == [EMBEDDER]
        chat = FakeEngineServer(port=int(chat_address.rpartition(":")[2])).start()
        wait_until(lambda: health(url)[0] == 200)
        assert listed(url) == sorted([MODEL_ID, EMBEDDER])
    finally:
        stop_process(shim)
        for server in (embedder, chat):
            if server is not None:
                server.stop()


def test_a_replica_down_leaves_its_model_ready_while_another_serves_it():
    a, b = FakeEngineServer().start(), FakeEngineServer().start()
    embedder = FakeEngineServer(model_id=EMBEDDER).start()
    shim, url = start_shim(f"{a.address},{b.address},{embedder.address}")
    try:
        wait_until(lambda: health(url)[0] == 200)
        a.stop()
        wait_until(lambda: health(url)[1]["engines"][a.address] == "UNREACHABLE")
        status, body = health(url)
        assert status == 200 and body["models"] == {MODEL_ID: "SERVING", EMBEDDER: "SERVING"}
        assert body["engines"] == {a.address: "UNREACHABLE", b.address: "SERVING", embedder.address: "SERVING"}
        assert listed(url) == sorted([MODEL_ID, EMBEDDER])
        embedder.stop()  # its model's only engine
        status, body = health(url)
        assert status == 503 and body["engine"] == "UNREACHABLE" and body["models"][EMBEDDER] == "UNREACHABLE"
    finally:
        stop_process(shim)
        for server in (a, b, embedder):
            server.stop()


class FakeEngineStack(Stack):
    """launcher.stack's Stack with the real shim in front of fake engines (tests/fake_engine.py): a chat
    engine listening `chat_delay_s` after its start and an embedding engine at once."""

    def __init__(self, chat_delay_s: float) -> None:
        super().__init__(embedding_model=EMBEDDER, startup_timeout=60.0)
        self.chat_delay_s = chat_delay_s

    def engine_command(self, index: int = 0) -> list[str]:
        return [sys.executable, str(REPO_ROOT / "tests" / "fake_engine.py"), "--port", str(self.engine_ports[index]),
                "--listen-after", str(self.chat_delay_s)]

    def embedding_command(self) -> list[str]:
        return [sys.executable, str(REPO_ROOT / "tests" / "fake_engine.py"), "--port", str(self.embedding_port),
                "--model-id", EMBEDDER]


def test_a_stack_is_up_only_once_the_shim_lists_every_model():
    """Before, the launcher saw the chat engine serve before the shim's channel had reconnected to it (its
    backoff reaches 2 s), and the shim's /health, knowing only the embedder's model, said 200."""
    with FakeEngineStack(chat_delay_s=2.0) as stack:
        assert listed(stack.shim_url) == sorted([MODEL_ID, EMBEDDER])
        assert health(stack.shim_url)[0] == 200
