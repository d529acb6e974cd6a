"""The Stack launcher's failure paths: a taken port and an engine that dies while starting."""

from __future__ import annotations

import socket

import pytest

from launcher import stack as launch
from launcher.stack import Stack, StackError, ephemeral_port_range, free_port


def test_taken_port_fails_before_starting_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stack = Stack(engine_port=taken.getsockname()[1])
        with pytest.raises(StackError, match="already in use"):
            stack.start()
    assert stack.engine is None and stack.shim is None


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable() -> None:
    """No outgoing connection (nor a probe connecting to itself) can take them before the server binds."""
    low, high = ephemeral_port_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= port <= high for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[-1]))


def test_free_port_skips_a_taken_port(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(launch, "_handed_out", set())  # so only the bind check can refuse it
        # Offer the taken port first: free_port must pass over it.
        monkeypatch.setattr("random.shuffle", lambda ports: ports.sort(key=lambda p: p != port))
        assert free_port() != port


@pytest.mark.model  # starts the real engine process (torch, transformers), which then fails
def test_dead_engine_is_reported_with_its_log(tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    stack = Stack(model=str(missing), log_dir=tmp_path / "logs", startup_timeout=240)
    with pytest.raises(StackError) as caught:
        stack.start()
    message = str(caught.value)
    assert "engine exited" in message
    assert "no-such-model" in message  # the tail of the engine's own error output
    assert stack.shim is not None and stack.shim.poll() is not None  # the shim was stopped too
