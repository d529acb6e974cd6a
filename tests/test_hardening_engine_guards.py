"""One real engine, guarded against what one caller or one setting could do to everyone: a request that
cannot be started (its sequences, its grammar matcher) fails alone and the engine keeps serving; a
direct gRPC caller's request_id is bounded and cleaned as the x-request-id metadata is; the metrics
listen on their own host (loopback by default), not on the gRPC port's.

The engine's gRPC port is on 127.0.0.2 (loopback too, yet another address than the metrics'), and
fault injection (core/faults.py) fails the start of any request whose prompt holds TAKE_MARKER."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from clients import EngineClient, Internal
from launcher.stack import Stack, free_port
from clients.request_builder import build_request
from common import ANSWER, QUESTION
from conduit_common.logs import MAX_REQUEST_ID_CHARS
from conftest import STARTUP_TIMEOUT_S
from engine_service.core.faults import FAULT_INJECT_TAKE_ENV

pytestmark = pytest.mark.model

GRPC_HOST = "127.0.0.2"
TAKE_MARKER = "okapi-take-fault"
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, int]]:
    metrics_port = free_port()
    # --metrics-port alone (not Stack's metrics_port, which names the stack's host): the default host.
    with Stack(host=GRPC_HOST, log_dir=tmp_path_factory.mktemp("logs"),
               engine_args=["--metrics-port", str(metrics_port)], engine_env={FAULT_INJECT_TAKE_ENV: TAKE_MARKER},
               startup_timeout=STARTUP_TIMEOUT_S) as stack:
        yield stack, metrics_port


@pytest.fixture(scope="module")
def engine(guarded: tuple[Stack, int]) -> Iterator[EngineClient]:
    with guarded[0].client(timeout=120) as client:
        yield client


def test_a_request_that_cannot_start_fails_alone(guarded: tuple[Stack, int], engine: EngineClient) -> None:
    fault_id = f"take-fault-{uuid.uuid4().hex[:8]}"
    with engine.generate(messages=STORY, temperature=0, max_tokens=24, ignore_eos=True) as stream:
        first = next(r for r in stream if r.WhichOneof("kind") == "chunk")  # the bystander runs first
        with pytest.raises(Internal) as caught:
            engine.complete(messages=[{"role": "user", "content": f"Say {TAKE_MARKER}."}], max_tokens=8,
                            metadata=[("x-request-id", fault_id)])
        assert fault_id in caught.value.message
        finals = [r.final for r in stream if r.WhichOneof("kind") == "final"]
    assert first.chunk.text and [f.completion_tokens for f in finals] == [24]
    assert engine.health() == "SERVING"
    assert engine.complete(messages=QUESTION, temperature=0, max_tokens=30).text == ANSWER
    log = guarded[0].engine_log.read_text(errors="replace")
    assert "InjectedFault" in log and fault_id in log


def test_a_direct_callers_request_id_is_bounded_and_cleaned(guarded: tuple[Stack, int],
                                                           engine: EngineClient) -> None:
    marker = f"FORGED-{uuid.uuid4().hex[:8]}"
    given = f"id-{uuid.uuid4().hex[:8]}\n{marker} ERROR a forged log line\r\n" + "x" * 1_000_000
    request = build_request(messages=QUESTION, temperature=0, max_tokens=4, request_id=given)
    ids = {response.request_id for response in engine.generate(request)}
    (kept,) = ids
    assert len(kept) <= MAX_REQUEST_ID_CHARS and kept.startswith(given[:11]) and kept.isprintable()
    assert engine.complete(request).text  # the same id again: it is served, cleaned alike
    lines = guarded[0].engine_log.read_text(errors="replace").splitlines()
    assert any(marker in line for line in lines), "the id is logged, on the line it belongs to"
    assert not [line for line in lines if line.startswith(marker)], "a newline in the id forged a log line"


def test_the_metrics_listen_on_their_own_host(guarded: tuple[Stack, int], engine: EngineClient) -> None:
    _, port = guarded
    assert engine.health() == "SERVING"  # gRPC on 127.0.0.2
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert b"conduit:num_requests_running" in response.read()
    with pytest.raises(urllib.error.URLError):  # not where gRPC listens: refused
        urllib.request.urlopen(f"http://{GRPC_HOST}:{port}/metrics", timeout=10)
