"""The Stack launcher's failure paths: a taken port and an engine that dies while starting."""

from __future__ import annotations

import socket

import pytest

from clients.launch import Stack, StackError


def test_taken_port_fails_before_starting_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stack = Stack(engine_port=taken.getsockname()[1])
        with pytest.raises(StackError, match="already in use"):
            stack.start()
    assert stack.engine is None and stack.shim is None


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
