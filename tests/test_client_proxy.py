"""No HTTP proxy in the environment takes an engine channel, only one the caller names
(clients/http_proxy.py): real channels in a subprocess whose http_proxy names a port where nothing
listens, to real gRPC health servers on loopback, and a recording proxy named by `proxy=`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from clients.http_proxy import proxy_options, proxy_url
from connect_proxy import ConnectProxy

REPO_ROOT = Path(__file__).resolve().parent.parent
DIRECT = [("grpc.enable_http_proxy", 0)]

# Two health servers on loopback, then each client's health() answer (or its error's class) by case.
CLIENTS = """
import asyncio, json, os
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from clients import AsyncEngineClient, EngineClient
from conduit.v1.contract import ENGINE_SERVICE

servers, ports = [], []  # held: a grpc.Server that is collected stops
for _ in range(2):
    servicer = health.HealthServicer()
    servicer.set(ENGINE_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    ports.append(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    servers.append(server)
a, b = (f"127.0.0.1:{port}" for port in ports)

def health(target, **options):
    try:
        with EngineClient(target, timeout=5, **options) as client:
            return client.health()
    except Exception as exc:
        return type(exc).__name__

async def async_health(target):
    async with AsyncEngineClient(target, timeout=5) as client:
        return await client.health()

print(json.dumps({
    "one": health(a),
    "localhost": health(a.replace("127.0.0.1", "localhost")),
    "list": health([a, b]),
    "async list": asyncio.run(async_health([a, b])),
    "proxy asked for": health(a, options=[("grpc.enable_http_proxy", 1)]),
    "proxy named": health(b, proxy=os.environ["NAMED_PROXY"]),
    "named proxy's target": b,
}), flush=True)
os._exit(0)  # not the servers' shutdown at exit: nothing is left to wait for
"""


def health_through_bogus_proxy(no_proxy: str | None, named_proxy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["NAMED_PROXY"] = named_proxy
    # A port held bound but not listening: connections to it are refused, and no server that another
    # test starts meanwhile can take it (one that answered the proxy's CONNECT could hold the call).
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        env["http_proxy"] = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        if no_proxy is not None:
            env["no_proxy"] = no_proxy
        done = subprocess.run([sys.executable, "-c", CLIENTS], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("no_proxy", [None, "127.0.0.1,localhost"])
def test_engine_channels_take_no_proxy_from_the_environment(no_proxy: str | None) -> None:
    """By gRPC's own rule every case but the second run's single addresses would fail: it proxies a host
    no_proxy does not list, and address lists whatever no_proxy lists."""
    with ConnectProxy() as named:
        answers = health_through_bogus_proxy(no_proxy, named.url)
    target = answers.pop("named proxy's target")
    assert answers == {
        "one": "SERVING", "localhost": "SERVING", "list": "SERVING", "async list": "SERVING",
        # The caller's options win: asked for, the environment's (bogus) proxy is used, and the call fails.
        "proxy asked for": "SERVING" if no_proxy else "Unavailable",
        "proxy named": "SERVING",
    }
    # Through the proxy named, unless no_proxy lists the host (gRPC's rule, kept).
    assert set(named.connected) == (set() if no_proxy else {target})


def test_every_engine_target_goes_direct_unless_a_proxy_is_named() -> None:
    targets = ("127.0.0.1:5", "[::1]:5", "localhost:5", "ipv4:127.0.0.1:5", "dns:///localhost:5", "10.0.0.1:5",
               "engine:50051", "dns:///engine.ns.svc:50051", "ipv4:10.0.0.1:5", "unix:/tmp/e.sock",
               "ipv4:10.0.0.1:5,10.0.0.2:5", "ipv6:[fd00::1]:5,[fd00::2]:5")
    for target in targets:
        assert proxy_options(target) == DIRECT, target
    for target in targets[:-2]:
        assert proxy_options(target, "http://proxy:3128") == [("grpc.enable_http_proxy", 1),
                                                               ("grpc.http_proxy", "http://proxy:3128")], target
    for target in targets[-2:]:  # gRPC would ask the proxy for "A,B"
        with pytest.raises(ValueError, match="address list"):
            proxy_options(target, "http://proxy:3128")
    assert proxy_url("http://user:secret@10.0.0.9:3128") == "http://user:secret@10.0.0.9:3128"
    for bad in ("proxy:3128", "https://proxy:3128", "socks5://proxy:1080", "http://proxy", "http://proxy:3128/x"):
        with pytest.raises(ValueError):
            proxy_url(bad)
