"""The shim's engine channels take no HTTP proxy from its environment, only the one --engine-proxy names
(clients/http_proxy.py): a real shim over two fake engines given as one multi-address --engine, with
grpc_proxy, https_proxy and http_proxy set in the shim's environment.

The engines are reached by this host's name: a loopback address already went direct (issue 41), but a
name that no_proxy does not list went to the proxy, as a remote engine's address did.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from common import lazy_module
from connect_proxy import ConnectProxy
from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process

openai = lazy_module("openai")  # imported by the first test that uses it

PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY")


def host_name_and_address() -> tuple[str, str]:
    """This host's name (not localhost) and the IPv4 address it resolves to (loopback or not)."""
    name = socket.gethostname()
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError:
        pytest.skip(f"this host's name {name!r} does not resolve")
    if name == "localhost":
        pytest.skip("this host is named localhost")
    return name, address


@pytest.fixture(scope="module")
def engine_target() -> Iterator[str]:
    """Two fake engines as one --engine value: NAME:PORT1,NAME:PORT2."""
    name, address = host_name_and_address()
    engines = [FakeEngineServer(host=address).start() for _ in range(2)]
    yield ",".join(f"{name}:{engine.port}" for engine in engines)
    for engine in engines:
        engine.stop()


def proxy_environment(url: str) -> dict[str, str]:
    return {**{variable: url for variable in PROXY_VARIABLES}, "no_proxy": "localhost,127.0.0.1",
            "no_grpc_proxy": ""}


def chat_through(shim_url: str) -> str:
    with openai.OpenAI(base_url=f"{shim_url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        assert [model.id for model in client.models.list()] == [MODEL_ID]
        answer = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
        return answer.choices[0].message.content


def test_environment_proxies_do_not_take_the_engine_channels(engine_target: str) -> None:
    """Before, each replica's channel went to the proxy, which refused it: no model listed, every call 503."""
    # A port held bound but not listening: connecting to it is refused, and no other test's server can take it.
    with socket.socket() as dead_proxy:
        dead_proxy.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{dead_proxy.getsockname()[1]}"
        shim, shim_url = start_shim(engine_target, env=proxy_environment(url))
        try:
            assert chat_through(shim_url) == "Hello from choice 0."
        finally:
            stop_process(shim)


def test_engine_proxy_takes_the_engine_channels(engine_target: str) -> None:
    with ConnectProxy() as proxy, socket.socket() as dead_proxy:
        dead_proxy.bind(("127.0.0.1", 0))
        shim, shim_url = start_shim(engine_target, "--engine-proxy", proxy.url,
                                    env=proxy_environment(f"http://127.0.0.1:{dead_proxy.getsockname()[1]}"))
        try:
            assert chat_through(shim_url) == "Hello from choice 0."
        finally:
            stop_process(shim)
        # Each replica's channel, by the name it was given (the proxy resolves it).
        assert set(proxy.connected) == set(engine_target.split(","))
