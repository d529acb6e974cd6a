"""The Stack launcher: its failure paths (a taken port, an engine that dies while starting) and the
shares of the cores it gives engines that run side by side."""

from __future__ import annotations

import os
import socket

import pytest

from launcher import stack as launch
from launcher.stack import Stack, StackError, ThreadShares, ephemeral_port_range, free_port, thread_shares


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


def test_engines_sharing_the_cores_share_them_by_demand(monkeypatch) -> None:
    """Engines whose torch threads outnumber the cores stall each other at OpenMP's waits (a chat
    stream's longest gap went from ~30 ms to 1.3 s beside embedding traffic), but an idle embedding
    engine needs none: the chat engine takes every core and gives the embedding engine its share only
    while it has work, through the file both are given (--core-share)."""
    assert thread_shares(2, 1, False) is None  # one engine alone takes them all
    assert thread_shares(2, 1, True) == ThreadShares(chat=2, chat_beside_embedding=1, embedding=1)
    assert thread_shares(16, 1, True) == ThreadShares(chat=16, chat_beside_embedding=12, embedding=4)
    assert thread_shares(16, 2, True) == ThreadShares(chat=8, chat_beside_embedding=6, embedding=4)
    assert thread_shares(4, 2, False) == ThreadShares(chat=2, chat_beside_embedding=2, embedding=0)  # replicas
    assert thread_shares(1, 1, True) == ThreadShares(chat=1, chat_beside_embedding=1, embedding=1)
    assert thread_shares(2, 3, True) == ThreadShares(chat=1, chat_beside_embedding=1, embedding=1)  # one at least
    monkeypatch.delenv("CONDUIT_THREADS", raising=False)  # conftest's choice for the tests' engines
    stack = Stack(model="m", embedding_model="e")
    shares = thread_shares(len(os.sched_getaffinity(0)), 1, True)

    def flag(command: list[str], name: str) -> str | None:
        return command[command.index(name) + 1] if name in command else None

    chat, embedder = stack.engine_command(), stack.embedding_command()
    assert flag(chat, "--threads") == str(shares.chat) == str(len(os.sched_getaffinity(0)))  # every core
    assert flag(chat, "--core-share-threads") == str(shares.chat_beside_embedding)
    assert flag(embedder, "--threads") == str(shares.embedding)
    assert flag(chat, "--core-share") == flag(embedder, "--core-share") == str(stack.log_dir / "core-share")
    assert "--threads" not in Stack(model="m").engine_command()
    assert "--core-share" not in Stack(model="m", replicas=2).engine_command()  # no embedding engine to yield to
    own = Stack(model="m", embedding_model="e", engine_args=["--threads", "3"])
    assert own.engine_command().count("--threads") == 1 and flag(own.engine_command(), "--threads") == "3"
    assert "--core-share" not in own.engine_command() + own.embedding_command()
    monkeypatch.setenv("CONDUIT_THREADS", "2")
    assert "--threads" not in Stack(model="m", embedding_model="e").engine_command()
    assert Stack(model="m", embedding_model="e", embedding_args=["--threads", "2"]).embedding_command()[-2:] == [
        "--threads", "2"]
