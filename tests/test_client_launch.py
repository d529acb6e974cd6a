"""The Stack launcher: its failure paths (a taken port, an engine that dies while starting) and the
shares of the cores it gives engines that run side by side."""

from __future__ import annotations

import os
import socket

import pytest

from launcher import stack as launch
from launcher.stack import Stack, StackError, ephemeral_port_range, free_port, thread_shares


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


def test_engines_sharing_the_cores_split_them(monkeypatch) -> None:
    """Engines whose torch threads outnumber the cores stall each other at OpenMP's waits (a chat
    stream's longest gap went from ~30 ms to 1.3 s beside embedding traffic): shares of the cores."""
    assert thread_shares(2, 1, False) is None  # one engine alone takes them all
    assert thread_shares(2, 1, True) == (1, 1)
    assert thread_shares(16, 1, True) == (12, 4)
    assert thread_shares(16, 2, True) == (6, 4)
    assert thread_shares(2, 3, True) == (1, 1)  # one thread at least
    monkeypatch.delenv("CONDUIT_THREADS", raising=False)  # conftest's choice for the tests' engines
    stack = Stack(model="m", embedding_model="e")
    cores = len(os.sched_getaffinity(0))
    chat, embed = thread_shares(cores, 1, True)
    assert stack.engine_command()[stack.engine_command().index("--threads") + 1] == str(chat)
    assert stack.embedding_command()[stack.embedding_command().index("--threads") + 1] == str(embed)
    assert "--threads" not in Stack(model="m").engine_command()
    own = Stack(model="m", embedding_model="e", engine_args=["--threads", "3"]).engine_command()
    assert own.count("--threads") == 1 and own[own.index("--threads") + 1] == "3"
    monkeypatch.setenv("CONDUIT_THREADS", "2")
    assert "--threads" not in Stack(model="m", embedding_model="e").engine_command()
