"""Routing over replicas by prefix and load (http_shim/routing/), on real shim processes in front of
fake engines (tests/fake_engine.py), plus the policies' rules on stand-in replicas.

- A replica that becomes ready after the shim started gets work at once; killing the first one
  then loses no request (refused calls go to the live replica). Another model's engine that comes
  up late, failing its first listings, is listed as soon as it answers.
- cache_aware: requests sharing a long prefix stay on the replica that served it, unless that
  replica is loaded well beyond the other, by the engine's report (other shims' work) or by this
  shim's own streams (load override); round_robin spreads them.
- A drained replica gets no new work and its prefix goes elsewhere; undrained, it gets work again.
- A stopped replica's prefix goes elsewhere without a failed request; restarted on its port, it
  gets work again.
- A replica back under another name serves the first request for that name.
- The shim's router metrics: requests by replica and decision, replica health.
- A routed call (in this process) refused before its first answer goes to another replica (and
  is counted), a refusal with nowhere left stands, one that answered is never sent elsewhere, one
  refused by a draining replica is not tried there again first, and with no healthy replica the
  others are tried anyway.
Which replica served a request is read from the fakes' own records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients import EngineClient, ResourceExhausted, Unavailable
from launcher.stack import free_port
from conduit.v1 import engine_pb2 as pb
from fake_engine import MODEL_ID, FakeEngineServer, start_fake_engine_process, start_shim, stop_process
from http_shim.metrics import ShimMetrics
from http_shim.routing import Router, RoutingConfig
from http_shim.routing.policies import CacheAware, Choice, LeastLoad, RoundRobin, prefer_resident
from http_shim.routing.pool import address_list, dns_name
from http_shim.routing.prefix import BLOCK_CHARS, PrefixIndex, prefix_blocks
from http_shim.routing.replica import SERVING
from test_replicas import OTHER_MODEL, counts, wait_until
from test_shim_http import open_raw_stream, post, read_until, request, say

# Long enough for several prefix blocks; the question after it is what differs.
SYSTEM = "You are the routing test's assistant. " + " ".join(f"rule {k}: answer briefly." for k in range(150))
SETTLE_S = 10.0  # bound on a health or load change reaching the router (it polls every 0.25 s)


def ask(url: str, question: str, system: str = SYSTEM) -> int:
    body = {"model": MODEL_ID, "messages": [{"role": "system", "content": system}, *say(question)]}
    status, _, raw = post(url, "/v1/chat/completions", body)
    assert status in (200, 503), raw
    return status


def router_metrics(url: str) -> dict[tuple[str, ...], float]:
    """(metric name, replica[, decision]) -> value, for the shim's conduit:router_* samples."""
    status, _, body = request(url, "GET", "/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name.startswith("conduit:router_"):
                labels = [sample.labels[name] for name in ("replica", "decision") if name in sample.labels]
                found[(sample.name, *labels)] = sample.value
    return found


def landed_on(server: FakeEngineServer, url: str, question: str, system: str = SYSTEM) -> bool:
    before = counts(server)[0]
    assert ask(url, question, system) == 200
    return counts(server)[0] == before + 1


@pytest.fixture
def pair() -> Iterator[tuple[FakeEngineServer, FakeEngineServer]]:
    servers = FakeEngineServer().start(), FakeEngineServer().start()
    yield servers
    for server in servers:
        server.stop()


def holder_and_other(url: str, pair: tuple[FakeEngineServer, FakeEngineServer]
                     ) -> tuple[FakeEngineServer, FakeEngineServer]:
    assert ask(url, "first") == 200
    return pair if counts(pair[0]) == [1] else (pair[1], pair[0])


# --- on real processes ----------------------------------------------------------------------------

def test_a_late_replica_gets_work_at_once_and_killing_the_first_loses_no_request() -> None:
    first, first_address = start_fake_engine_process()
    late_port = free_port()
    shim, url = start_shim(f"{first_address},127.0.0.1:{late_port}")
    late = None
    try:
        for k in range(4):  # only the first is up
            assert ask(url, f"early {k}", system="short") == 200
        late = FakeEngineServer(port=late_port).start()
        wait_until(lambda: landed_on(late, url, "late?", system="short"), SETTLE_S)

        first.kill()  # its calls are refused from now on: the router sends them to the live replica
        first.wait()
        before = counts(late)[0]
        statuses = [ask(url, f"after {k}", system="short") for k in range(24)]
        assert statuses == [200] * 24
        assert counts(late)[0] == before + 24
    finally:
        stop_process(shim)
        first.kill()
        if late is not None:
            late.stop()


def test_a_late_engine_of_another_model_is_listed_once_it_answers(pair) -> None:
    """Several models: one whose engine comes up after the shim's first listing, and fails its
    first listings (busy as it starts), is listed and served as soon as it answers, not after the
    model list's 30 s."""
    late_port = free_port()
    shim, url = start_shim(f"{pair[0].address},127.0.0.1:{late_port}")
    late = FakeEngineServer(port=late_port, model_id=OTHER_MODEL)
    late.engine.list_failures = 2
    try:
        status, _, body = request(url, "GET", "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [MODEL_ID]
        late.start()
        wait_until(lambda: OTHER_MODEL in [m["id"] for m in json.loads(request(url, "GET", "/v1/models")[2])["data"]],
                   SETTLE_S)
        status, _, raw = post(url, "/v1/chat/completions", {"model": OTHER_MODEL, "messages": say("hi")})
        assert status == 200 and json.loads(raw)["model"] == OTHER_MODEL
    finally:
        stop_process(shim)
        late.stop()


def test_a_shared_prefix_sticks_to_its_replica_unless_that_one_is_loaded_well_beyond(pair) -> None:
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}", "--routing-balance-abs", "2",
                           "--routing-balance-rel", "1.5")
    try:
        holder, other = holder_and_other(url, pair)
        for k in range(6):
            assert ask(url, f"question {k}") == 200
        assert counts(holder, other) == [7, 0]
        # Another prefix is placed by load (both idle: in turn), and sticks too.
        assert ask(url, "one", system="Another long system prompt. " * 40) == 200
        assert ask(url, "two", system="Another long system prompt. " * 40) == 200
        assert counts(holder, other) in ([9, 0], [7, 2])

        holder.engine.queued = 10  # as the engine reports it: other shims' work, say
        wait_until(lambda: landed_on(other, url, "while it is busy"), SETTLE_S)
        metrics = router_metrics(url)
        assert metrics[("conduit:router_requests_total", holder.address, "cache_hit")] >= 6
        assert metrics[("conduit:router_requests_total", other.address, "load_override")] >= 1
        assert metrics[("conduit:router_replica_healthy", holder.address)] == 1
        assert metrics[("conduit:router_replica_load", holder.address)] >= 8  # the report, give or take our own calls
    finally:
        stop_process(shim)


def test_streams_of_this_shim_saturating_the_prefix_holder_send_the_next_request_elsewhere(pair) -> None:
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}", "--routing-balance-abs", "2",
                           "--routing-balance-rel", "1.5", "--heartbeat-interval", "0.5")
    streams = []
    try:
        holder, other = holder_and_other(url, pair)
        body = {"model": MODEL_ID, "stream": True, "messages": [{"role": "system", "content": SYSTEM}, *say("hang")]}
        for _ in range(3):  # they follow the prefix: the holder runs 3, the other none
            streams.append(open_raw_stream(url, body))
            read_until(streams[-1], b"data: ")
        assert [server.engine.running for server in (holder, other)] == [3, 0]
        assert landed_on(other, url, "and now?")  # 3 more than 0, and more than 1.5 times 0
        assert router_metrics(url)[("conduit:router_requests_total", other.address, "load_override")] == 1
    finally:
        for stream in streams:
            stream.close()
        stop_process(shim)


def test_round_robin_spreads_a_shared_prefix(pair) -> None:
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}", "--routing", "round_robin")
    try:
        for k in range(6):
            assert ask(url, f"question {k}") == 200
        assert counts(*pair) == [3, 3]
    finally:
        stop_process(shim)


def test_a_drained_replica_gets_no_work_and_its_prefix_moves_until_it_is_back(pair) -> None:
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}")
    try:
        holder, other = holder_and_other(url, pair)
        holder.set_serving(False)  # draining: GetLoad and health say so
        wait_until(lambda: landed_on(other, url, "drained?"), SETTLE_S)
        before = counts(holder, other)
        for k in range(6):
            assert ask(url, f"question {k}") == 200
        assert counts(holder, other) == [before[0], before[1] + 6]
        assert router_metrics(url)[("conduit:router_replica_healthy", holder.address)] == 0

        holder.set_serving(True)
        wait_until(lambda: landed_on(holder, url, "back?", system="short"), SETTLE_S)
    finally:
        stop_process(shim)


def test_a_stopped_replica_loses_no_request_and_gets_work_again_when_restarted(pair) -> None:
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}")
    restarted = None
    try:
        holder, other = holder_and_other(url, pair)
        holder.stop()
        before = counts(other)[0]
        statuses = [ask(url, f"question {k}") for k in range(8)]  # the first may find it gone: retried
        assert statuses == [200] * 8
        assert counts(other)[0] == before + 8

        restarted = FakeEngineServer(port=holder.port).start()
        wait_until(lambda: landed_on(restarted, url, "back?", system="short"), SETTLE_S)
    finally:
        stop_process(shim)
        if restarted is not None:
            restarted.stop()


# --- routed calls in this process, over real gRPC ---------------------------------------------------

@pytest.fixture
def routed(pair) -> Iterator[tuple[Router, ShimMetrics]]:
    metrics = ShimMetrics()
    router = Router([server.address for server in pair], EngineClient, RoutingConfig(policy="round_robin"), metrics)
    yield router, metrics
    router.pool.close()


def retries(metrics: ShimMetrics, server: FakeEngineServer) -> float:
    return metrics.registry.get_sample_value("conduit:router_retries_total", {"replica": server.address}) or 0.0


def test_a_routed_call_goes_elsewhere_only_before_its_first_answer(pair, routed) -> None:
    router, metrics = routed
    refusing, serving = pair
    refusing.engine.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED  # its queue is full
    engine = router.engine(MODEL_ID)
    for k in range(2):  # dealt in turn: one of them is sent to the refusing replica first
        assert list(engine.generate_shared(pb.GenerateRequest(text="hi", request_id=f"r{k}")))[-1].HasField("final")
    assert counts(refusing, serving) == [1, 2]
    assert (retries(metrics, refusing), retries(metrics, serving)) == (1, 0)

    serving.engine.refuse = grpc.StatusCode.RESOURCE_EXHAUSTED  # nowhere left: the refusal stands (a 429)
    with pytest.raises(ResourceExhausted):
        list(engine.generate_shared(pb.GenerateRequest(text="hi")))

    refusing.engine.refuse = serving.engine.refuse = None
    call = engine.generate_shared(pb.GenerateRequest(text="hang", request_id="answered"))
    assert next(call).HasField("prompt")
    owner, other = pair if any(r.request_id == "answered" for r in pair[0].engine.requests) else pair[::-1]
    owner.stop()  # UNAVAILABLE, which a call with no answer yet would take elsewhere
    with pytest.raises(Unavailable):
        list(call)
    assert not any(r.request_id == "answered" for r in other.engine.requests)  # its output was seen: not replayed


def test_a_routed_call_refused_by_a_draining_replica_goes_elsewhere_without_trying_it_again(pair, routed) -> None:
    """One owner of a routed call's retries, the router: the replica's own stream does not send it
    there again (with a backoff) before the router fails it over."""
    router, metrics = routed
    draining, serving = pair
    draining.engine.refuse = grpc.StatusCode.UNAVAILABLE  # as a draining engine refuses, before its poll says so
    engine = router.engine(MODEL_ID)
    for k in range(2):  # dealt in turn: one of them is sent to the draining replica first
        assert list(engine.generate_shared(pb.GenerateRequest(text="hi", request_id=f"d{k}")))[-1].HasField("final")
    assert counts(draining, serving) == [1, 2]  # asked once, not once per retry of its stream
    assert retries(metrics, draining) == 1


def test_with_no_healthy_replica_a_routed_call_tries_the_others_anyway(pair, routed) -> None:
    router, metrics = routed
    for server in pair:
        server.set_serving(False)
    wait_until(lambda: all(replica.state != SERVING for replica in router.pool.replicas()), SETTLE_S)
    assert list(router.engine(MODEL_ID).generate_shared(pb.GenerateRequest(text="hi")))[-1].HasField("final")
    decisions = [metrics.registry.get_sample_value("conduit:router_requests_total",
                                                   {"replica": server.address, "decision": "unhealthy"})
                 for server in pair]
    assert decisions == [1.0, None]  # the first listed, as none is better


def test_embeddings_go_to_the_least_loaded_replica(pair, routed) -> None:
    """Embed (and the other unary calls) on the least loaded healthy replica, not always the first listed."""
    router, _ = routed
    engine = router.engine(MODEL_ID)
    first, second = (server for replica in router.serving(MODEL_ID) for server in pair
                     if server.address == replica.address)
    first.engine.queued = 10  # busy with other shims' work, as its report says
    wait_until(lambda: min(router.serving(MODEL_ID), key=lambda replica: replica.load).address == second.address,
               SETTLE_S)
    for _ in range(3):
        engine.embed(["a text"], model=MODEL_ID)
    assert (len(first.engine.embed_calls), len(second.engine.embed_calls)) == (0, 3)
    first.engine.queued, second.engine.queued = 0, 10
    wait_until(lambda: min(router.serving(MODEL_ID), key=lambda replica: replica.load).address == first.address,
               SETTLE_S)
    engine.embed(["a text"], model=MODEL_ID)
    assert (len(first.engine.embed_calls), len(second.engine.embed_calls)) == (1, 3)


# --- the rules, on stand-in replicas ---------------------------------------------------------------

class StandIn:
    def __init__(self, address: str, load: int = 0) -> None:
        self.address = address
        self.load = load
        self.prefixes = PrefixIndex()
        self.resident_adapters: set[str] = set()

    def resident(self, model: str) -> bool:
        return model in self.resident_adapters


def chat(system: str, question: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="system", content=system),
                                                          pb.ChatMessage(role="user", content=question)]))


def test_prefix_blocks_chain_whole_blocks_of_the_input() -> None:
    one, two = prefix_blocks(chat(SYSTEM, "a")), prefix_blocks(chat(SYSTEM, "b" * 600))
    assert len(one) >= len(SYSTEM) // BLOCK_CHARS
    assert two[:len(one)] == one and len(two) > len(one)  # the shared prefix, then the question's blocks
    assert prefix_blocks(chat("x" + SYSTEM, "a"))[0] != one[0]  # a block stands for all before it
    assert prefix_blocks(pb.GenerateRequest(text="short")) == []


def test_prefix_index_matches_from_the_start_and_forgets_the_least_recent() -> None:
    index = PrefixIndex(capacity_blocks=4)
    index.add([1, 2, 3])
    assert index.match([1, 2, 9]) == 2 and index.match([9, 1]) == 0
    index.add([7, 8])  # over capacity: 1 goes first
    assert len(index) == 4 and index.match([1, 2]) == 0 and index.match([7, 8]) == 2
    old = PrefixIndex(max_age_s=0.0)
    old.add([1])
    assert old.match([1]) == 0


def test_policies_choose_by_turn_load_and_prefix() -> None:
    a, b = StandIn("a"), StandIn("b")
    turns = RoundRobin()
    assert [turns.choose([a, b], []).replica.address for _ in range(4)] == ["a", "b", "a", "b"]
    b.load = 3
    assert LeastLoad().choose([a, b], []).replica is a

    b.load = 0
    policy = CacheAware(balance_abs=2, balance_rel=1.5)
    blocks = prefix_blocks(chat(SYSTEM, "q"))
    assert policy.choose([a, b], blocks).reason == "cache_miss"
    b.prefixes.add(blocks)
    assert policy.choose([a, b], blocks) == Choice(b, "cache_hit")
    b.load = 2  # not more than 2 beyond the least loaded
    assert policy.choose([a, b], blocks) == Choice(b, "cache_hit")
    b.load, a.load = 4, 1  # 3 more, and more than 1.5 times as many
    assert policy.choose([a, b], blocks) == Choice(a, "load_override")
    a.load = 3  # 4 is not 1.5 times 3
    assert policy.choose([a, b], blocks) == Choice(b, "cache_hit")
    assert policy.choose([a, b], prefix_blocks(chat("Another system prompt. " * 30, "q"))) == Choice(a, "cache_miss")
    a.load = 12  # a new prefix goes where the fewest are held, unless that one is loaded beyond the balance
    assert policy.choose([a, b], prefix_blocks(chat("Another system prompt. " * 30, "q"))) == Choice(b, "cache_miss")


def test_an_adapters_requests_prefer_the_replicas_where_it_is_resident_unless_they_are_loaded_beyond() -> None:
    a, b, c = StandIn("a"), StandIn("b"), StandIn("c")
    b.resident_adapters.add("sql")
    assert prefer_resident([a, b, c], "sql", 2, 1.5) == [b]
    assert prefer_resident([a, b, c], "base", 2, 1.5) == [a, b, c]  # the base model (or an adapter resident nowhere)
    b.load = 2
    assert prefer_resident([a, b, c], "sql", 2, 1.5) == [b]  # not more than 2 beyond the least loaded
    b.load, a.load = 5, 1
    assert prefer_resident([a, b, c], "sql", 2, 1.5) == [a, b, c]  # 5 beyond c, the least loaded: any may bring it in


def test_dns_and_list_targets_parse() -> None:
    assert dns_name("dns:///engines.conduit.svc:50051") == ("engines.conduit.svc", "50051")
    assert dns_name("dns://8.8.8.8/engines:7") == ("engines", "7")
    assert dns_name("dns:engines:7") == ("engines", "7")
    assert dns_name("127.0.0.1:5") is None
    assert address_list("ipv4:127.0.0.1:5,127.0.0.2:6") == ["127.0.0.1:5", "127.0.0.2:6"]
    assert address_list("127.0.0.1:5") == ["127.0.0.1:5"]


def test_a_dns_target_follows_what_its_name_resolves_to(pair, monkeypatch) -> None:
    """New addresses behind the name become replicas at once; one it no longer returns is retired."""
    from clients.engine_client import EngineClient
    from http_shim.routing import pool as pool_module
    from http_shim.routing.replica import SERVING

    answers = [[pair[0].address]]
    monkeypatch.setattr(pool_module, "DNS_REFRESH_S", 0.05)
    monkeypatch.setattr(pool_module, "resolve", lambda host, port: answers[-1])
    dialed = []

    def connect(address: str, server_name: str = "") -> EngineClient:
        dialed.append((address, server_name))  # the name: what a TLS certificate would carry
        return EngineClient(address)

    replicas = pool_module.ReplicaPool(["dns:///engines.example:50051"], connect)
    try:
        wait_until(lambda: [r.address for r in replicas.replicas()] == [pair[0].address], SETTLE_S)
        assert dialed == [(pair[0].address, "engines.example")]
        answers.append([pair[0].address, pair[1].address])  # scaled up
        wait_until(lambda: [r.state for r in replicas.replicas()] == [SERVING, SERVING], SETTLE_S)
        assert replicas.replicas()[1].serves(MODEL_ID)
        gone = replicas.replicas()[0]
        answers.append([pair[1].address])  # scaled down
        wait_until(lambda: [r.address for r in replicas.replicas()] == [pair[1].address], SETTLE_S)
        assert gone.retired
    finally:
        replicas.close()


def test_a_replica_back_under_another_name_serves_the_first_request_for_it(pair) -> None:
    """Its channel may still be waiting to reconnect when the request comes: the unknown name makes
    the shim wait a moment for the replicas that are away, rather than answer 404 at once."""
    shim, url = start_shim(f"{pair[0].address},{pair[1].address}")
    renamed = None
    try:
        assert ask(url, "hi", system="short") == 200
        pair[1].stop()
        wait_until(lambda: router_metrics(url)[("conduit:router_replica_healthy", pair[1].address)] == 0, SETTLE_S)
        renamed = FakeEngineServer(port=pair[1].port, model_id=OTHER_MODEL).start()
        status, _, raw = post(url, "/v1/chat/completions", {"model": OTHER_MODEL, "messages": say("hi")})
        assert status == 200 and json.loads(raw)["model"] == OTHER_MODEL
    finally:
        stop_process(shim)
        if renamed is not None:
            renamed.stop()


def test_routing_flags() -> None:
    from http_shim.options import parse_args
    from http_shim.routing import RoutingConfig

    args = parse_args(["--routing", "least_load", "--routing-balance-abs", "3"])
    assert args.config.routing == RoutingConfig("least_load", 3, 1.5)
    assert parse_args([]).config.routing.policy == "cache_aware"
    assert parse_args([]).config.routing.prefix_view == "kv_events"
    assert parse_args(["--routing-prefix-view", "text"]).config.routing.prefix_view == "text"
    for bad in (["--routing", "random"], ["--routing-balance-rel", "0.5"], ["--routing-balance-abs", "-1"],
                ["--routing-prefix-view", "tokens"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_replicas_behind_a_name_are_verified_by_that_name_over_tls(tmp_path) -> None:
    """The shim dials each address a name resolves to, but checks the engine's certificate
    against the name (a certificate names the Service, not each pod's address)."""
    from engine_service.serving.background import BackgroundServer
    from engine_service.serving.security import ServerSecurity
    from engine_tls import CertificateAuthority, write_pair
    from fake_engine import FakeEngine

    ca = CertificateAuthority("routing-test-ca")
    cert, key = write_pair(tmp_path, "server", *ca.issue("conduit-engine", server=True, ip=False))  # localhost only
    server = BackgroundServer(FakeEngine(), "127.0.0.1", 0, security=ServerSecurity(cert_file=cert, key_file=key))
    server.start()
    shim, url = start_shim(f"dns:///localhost:{server.port}", "--engine-tls-ca", ca.write(tmp_path))
    try:
        assert ask(url, "hi", system="short") == 200
    finally:
        stop_process(shim)
        server.stop(grace=0)
