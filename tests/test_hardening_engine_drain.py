"""Graceful drain of the real engine process: SIGTERM turns health NOT_SERVING and refuses new
Generate calls with UNAVAILABLE, lets a running stream finish normally, ends streams still running
when the drain ends (--drain-seconds, or a second signal) with UNAVAILABLE (an error event through
the shim, never [DONE]), and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from clients import EngineClient, Unavailable
from launcher.stack import Stack
from common import MODEL, STORY
from conftest import STARTUP_TIMEOUT_S

pytestmark = pytest.mark.model

FINISHING_TOKENS = 32
ENDLESS_TOKENS = 4000  # minutes of generation: only the drain's end stops it
# Long enough for the finishing stream on a busy machine; the test ends the drain with a second signal.
LONG_DRAIN_SECONDS = 600
SHORT_DRAIN_SECONDS = 2


class Background:
    """Runs `work` on a thread, keeping its result or exception; `started` is set once it produced output."""

    def __init__(self, work: Callable[[Background], Any]) -> None:
        self.started = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[Background], Any]) -> None:
        try:
            self.result = work(self)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            self.error = error
        finally:
            self.started.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "still running"


def grpc_stream(client: EngineClient, max_tokens: int) -> Callable[[Background], Any]:
    def work(me: Background) -> tuple[list[str], list]:
        kinds, finals = [], []
        with client.generate(messages=STORY, max_tokens=max_tokens, ignore_eos=True) as stream:
            for response in stream:
                kind = response.WhichOneof("kind")
                kinds.append(kind)
                if kind == "chunk":
                    me.started.set()
                elif kind == "final":
                    finals.append(response.final)
        return kinds, finals
    return work


def shim_stream(base_url: str) -> Callable[[Background], Any]:
    def work(me: Background) -> str:
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as client:
            text = ""
            stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=ENDLESS_TOKENS,
                                                    stream=True, extra_body={"ignore_eos": True})
            for chunk in stream:
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    me.started.set()
            return text
    return work


def wait_not_serving(stack: Stack, since: float) -> None:
    with stack.client(timeout=10) as probe:
        while probe.health() != "NOT_SERVING":
            assert time.monotonic() - since < 5, "health still SERVING 5 s after SIGTERM"
            time.sleep(0.05)


def test_sigterm_drains_then_exits_zero(tmp_path) -> None:
    with Stack(engine_args=["--drain-seconds", str(LONG_DRAIN_SECONDS)], log_dir=tmp_path,
               startup_timeout=STARTUP_TIMEOUT_S) as stack, stack.client(timeout=600) as client:
        endless = Background(grpc_stream(client, ENDLESS_TOKENS))
        through_shim = Background(shim_stream(stack.base_url))
        for work in (endless, through_shim):
            assert work.started.wait(120), "a stream produced nothing"
        finishing = Background(grpc_stream(client, FINISHING_TOKENS))
        assert finishing.started.wait(120), "a stream produced nothing"
        assert finishing.error is None and finishing.result is None, "the finishing stream ended before SIGTERM"

        signalled = time.monotonic()
        stack.engine.send_signal(signal.SIGTERM)
        wait_not_serving(stack, signalled)
        with stack.client(timeout=10) as probe:
            with pytest.raises(Unavailable) as refused:
                probe.complete(messages=STORY, max_tokens=4)
            assert "draining" in refused.value.message
            assert probe.list_models()[0].id == MODEL  # only Generate is refused

        finishing.join(300)
        assert finishing.error is None, finishing.error
        kinds, finals = finishing.result
        assert kinds[0] == "prompt" and kinds[-1] == "final"
        assert [f.completion_tokens for f in finals] == [FINISHING_TOKENS]  # completed normally, in full
        assert endless.error is None and through_shim.error is None, "the drain cut streams before its deadline"
        assert stack.engine.poll() is None

        stack.engine.send_signal(signal.SIGTERM)  # a second signal ends the drain now
        endless.join(60)
        assert isinstance(endless.error, Unavailable), endless.error
        assert "shut down" in endless.error.message
        through_shim.join(60)
        assert isinstance(through_shim.error, openai.APIError), f"the shim's stream ended with {through_shim.error!r}"
        assert stack.engine.wait(timeout=30) == 0
        log = stack.engine_log.read_text()
        assert "draining" in log and "cut by shutdown" in log and "engine stopped" in log


def test_streams_running_at_the_drain_deadline_end_with_unavailable(tmp_path) -> None:
    with Stack(engine_args=["--drain-seconds", str(SHORT_DRAIN_SECONDS)], log_dir=tmp_path,
               startup_timeout=STARTUP_TIMEOUT_S) as stack, stack.client(timeout=600) as client:
        endless = Background(grpc_stream(client, ENDLESS_TOKENS))
        assert endless.started.wait(120), "the stream produced nothing"
        stack.engine.send_signal(signal.SIGTERM)
        endless.join(SHORT_DRAIN_SECONDS + 60)
        assert isinstance(endless.error, Unavailable), endless.error
        assert "drain deadline" in endless.error.message
        assert stack.engine.wait(timeout=30) == 0
