"""Replicas and several models without a model: fake engines on loopback behind the clients and the shim.

Round robin over the healthy replicas, a NOT_SERVING (draining) replica skipped, a stopped one
retried around, routing by the request's model, and a 404 that names the served models.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from clients import AsyncEngineClient, EngineClient, Unavailable
from clients.replicas import channel_target, split_addresses
from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process
from test_shim_http import error_of, post, request, say

OTHER_MODEL = "other-model"
HEALTH_SETTLE_S = 5.0  # bound on how long a health change takes to reach the channel


def counts(*servers: FakeEngineServer) -> list[int]:
    return [len(server.engine.requests) for server in servers]


def wait_until(condition, timeout_s: float = HEALTH_SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.fixture
def pair() -> Iterator[tuple[FakeEngineServer, FakeEngineServer]]:
    servers = FakeEngineServer().start(), FakeEngineServer().start()
    yield servers
    for server in servers:
        server.stop()


def test_targets():
    assert split_addresses(["a:1,b:2", " c:3 ", ""]) == ["a:1", "b:2", "c:3"]
    assert channel_target("127.0.0.1:5") == "127.0.0.1:5"
    assert channel_target("dns:///engine:50051") == "dns:///engine:50051"
    assert channel_target(["127.0.0.1:5", "127.0.0.2:6"]) == "ipv4:127.0.0.1:5,127.0.0.2:6"
    assert channel_target("localhost:5,127.0.0.1:6") in ("ipv4:127.0.0.1:5,127.0.0.1:6", "ipv6:[::1]:5,[127.0.0.1]:6")
    assert channel_target(["[::1]:5", "[::1]:6"]) == "ipv6:[::1]:5,[::1]:6"
    with pytest.raises(ValueError):
        channel_target(["dns:///engine:1", "127.0.0.1:2"])
    with pytest.raises(ValueError):
        channel_target([])


def test_client_spreads_skips_not_serving_and_retries_around_a_dead_replica(pair):
    a, b = pair
    with EngineClient([a.address, b.address], timeout=10) as client:
        wait_until(lambda: bool(client.complete(prompt="hi")) and min(counts(a, b)) > 0)  # both connected
        before = counts(a, b)
        for _ in range(10):
            client.complete(prompt="hi")
        spread = [after - first for after, first in zip(counts(a, b), before)]
        assert spread == [5, 5]  # round robin over two ready replicas

        b.set_serving(False)  # as a draining engine does: it gets no new work
        wait_until(lambda: _all_to_a(client, a, b))
        b.set_serving(True)
        wait_until(lambda: _some_to(client, b, a))

        a.stop()  # no error: calls that found it gone are retried on b
        for _ in range(10):
            assert client.complete(prompt="hi").choices[0].text


def _all_to_a(client: EngineClient, a: FakeEngineServer, b: FakeEngineServer) -> bool:
    before = counts(a, b)
    for _ in range(6):
        client.complete(prompt="hi")
    after = counts(a, b)
    return after[1] == before[1] and after[0] == before[0] + 6


def _some_to(client: EngineClient, target: FakeEngineServer, other: FakeEngineServer) -> bool:
    before = counts(target)[0]
    for _ in range(4):
        client.complete(prompt="hi")
    return counts(target)[0] > before


def test_async_client_spreads_over_replicas(pair):
    a, b = pair

    async def run() -> None:
        async with AsyncEngineClient(f"{a.address},{b.address}", timeout=10) as client:
            await client.complete(prompt="warm up")
            for _ in range(20):
                await client.complete(prompt="hi")
            assert (await client.list_models())[0].id == MODEL_ID

    asyncio.run(run())
    assert min(counts(a, b)) >= 5


def test_shim_routes_by_model_over_replicas(pair):
    a, b = pair
    other = FakeEngineServer(model_id=OTHER_MODEL).start()
    shim, url = start_shim(f"{a.address},{b.address}", "--engine", other.address, "--heartbeat-interval", "0.5")
    try:
        status, _, body = request(url, "GET", "/v1/models")
        assert status == 200
        assert sorted(m["id"] for m in json.loads(body)["data"]) == sorted([MODEL_ID, OTHER_MODEL])
        status, _, body = request(url, "GET", "/health")
        assert status == 200 and json.loads(body)["models"] == {MODEL_ID: "SERVING", OTHER_MODEL: "SERVING"}

        for _ in range(10):
            for model in (MODEL_ID, OTHER_MODEL):
                status, _, raw = post(url, "/v1/chat/completions", {"model": model, "messages": say("hi")})
                assert status == 200 and json.loads(raw)["model"] == model
        assert counts(other) == [10]
        assert sum(counts(a, b)) == 10 and min(counts(a, b)) >= 3  # both replicas of fake-model got work

        status, _, raw = post(url, "/v1/chat/completions", {"model": "nope", "messages": say("hi")})
        error = error_of(raw)
        assert status == 404 and error["code"] == "model_not_found"
        assert MODEL_ID in error["message"] and OTHER_MODEL in error["message"]

        status, _, body = request(url, "GET", f"/v1/models/{OTHER_MODEL}")
        assert status == 200 and json.loads(body)["id"] == OTHER_MODEL

        a.set_serving(False)  # draining: the shim's channel sends fake-model's work to b only
        time.sleep(0.5)
        before = counts(a)
        for _ in range(6):
            status, _, _ = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")})
            assert status == 200
        assert counts(a) == before
    finally:
        stop_process(shim)
        other.stop()


def test_a_stream_that_answered_is_not_retried_when_its_replica_dies(pair):
    a, b = pair
    with EngineClient([a.address, b.address], timeout=10) as client:
        wait_until(lambda: bool(client.complete(prompt="hi")) and min(counts(a, b)) > 0)
        stream = client.generate(prompt="long:100000", request_id="committed")
        for received, _ in enumerate(stream):
            if received == 3:
                break
        owner, survivor = (a, b) if any(r.request_id == "committed" for r in a.engine.requests) else (b, a)
        owner.stop()  # cancels its calls: the client sees UNAVAILABLE after responses were committed
        with pytest.raises(Unavailable):
            for _ in stream:
                pass
        assert not any(r.request_id == "committed" for r in survivor.engine.requests)  # never replayed
        assert client.complete(prompt="hi").choices[0].text  # new work goes to the survivor


def test_shim_takes_a_dns_target_beside_other_models(pair):
    a, b = pair  # fake-model behind a name (its own group) and at a plain address: dealt in turn
    other = FakeEngineServer(model_id=OTHER_MODEL).start()
    shim, url = start_shim(f"dns:///127.0.0.1:{a.port}", "--engine", other.address, "--engine", b.address)
    try:
        status, _, body = request(url, "GET", "/v1/models")
        assert status == 200
        assert sorted(m["id"] for m in json.loads(body)["data"]) == sorted([MODEL_ID, OTHER_MODEL])
        for model in (MODEL_ID, OTHER_MODEL, MODEL_ID, MODEL_ID, MODEL_ID):
            status, _, raw = post(url, "/v1/chat/completions", {"model": model, "messages": say("hi")})
            assert status == 200 and json.loads(raw)["model"] == model
        assert counts(a, b, other) == [2, 2, 1]
        status, _, body = request(url, "GET", "/health")
        assert status == 200 and json.loads(body)["models"] == {MODEL_ID: "SERVING", OTHER_MODEL: "SERVING"}
    finally:
        stop_process(shim)
        other.stop()


def test_shim_regroups_when_a_replica_is_renamed(pair):
    a, b = pair
    shim, url = start_shim(f"{a.address},{b.address}")
    try:
        status, _, _ = post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")})
        assert status == 200
        b.engine.model_id = OTHER_MODEL  # as if b restarted with --served-model-name other-model
        statuses = []
        deadline = time.monotonic() + HEALTH_SETTLE_S
        while statuses[-4:] != [200] * 4:  # at most a stale 404 or two, then fake-model is a's alone
            assert time.monotonic() < deadline, statuses
            statuses.append(post(url, "/v1/chat/completions", {"model": MODEL_ID, "messages": say("hi")})[0])
            time.sleep(0.1)
        status, _, raw = post(url, "/v1/chat/completions", {"model": OTHER_MODEL, "messages": say("hi")})
        assert status == 200 and json.loads(raw)["model"] == OTHER_MODEL
        assert b.engine.requests[-1].model == OTHER_MODEL
    finally:
        stop_process(shim)
