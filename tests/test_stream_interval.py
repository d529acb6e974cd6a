"""--stream-interval: a stream's tokens go out every N steps, its first token and its end at once,
and what is sent (tokens, text, finals) does not change, in the engine's events and through the shim's
SSE. The default (auto) sends every token until a step feeds more than 8 requests, then groups them."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from launcher.stack import Stack
from conftest import STARTUP_TIMEOUT_S, TEST_KV_CACHE_GB
from engine_service.__main__ import parse_args
from engine_service.core.config import EngineConfig
from engine_service.core.engine import Engine, build_engine
from engine_service.core.requests import deliver
from engine_service.core.pacing import auto_stream_interval
from engine_service.core.events import ChunkEvent, Event, FinalEvent, FinishReason
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.sequence import Request
from engine_service.model.loader import load_model
from common import lazy_module

openai = lazy_module("openai")  # imported by the first test that uses it

MAX_TOKENS = 13
# The module's engine runs in this process (conftest.py's one_torch_thread says why).
pytestmark = [pytest.mark.in_process_engine, pytest.mark.usefixtures("one_torch_thread")]


class Recorder:
    """A request's sink: every sink call's events, in order."""

    def __init__(self, choices: int) -> None:
        self.calls: list[list[Event]] = []
        self._finals = 0
        self._choices = choices
        self.done = threading.Event()

    def __call__(self, events: list[Event]) -> None:
        self.calls.append(events)
        self._finals += sum(isinstance(e, FinalEvent) for e in events)
        if self._finals == self._choices:
            self.done.set()

    def chunks(self, index: int = 0) -> list[ChunkEvent]:
        return [e for call in self.calls for e in call if isinstance(e, ChunkEvent) and e.index == index]



@pytest.fixture(scope="module")
def engine() -> Engine:
    """One engine, stepped by the tests themselves (no loop thread): each step returns its outputs,
    which the test delivers to the sinks. The interval is set per test (0: auto, the default)."""
    return build_engine(load_model(None, device="cpu"), EngineConfig(kv_cache_gb=TEST_KV_CACHE_GB))


def run_until_done(engine: Engine, sinks: list[Recorder]) -> None:
    for _ in range(1000):
        if all(sink.done.is_set() for sink in sinks):
            return
        deliver(engine.loop.step())
    raise AssertionError("the engine did not finish in 1000 steps")


def submit(engine: Engine, n: int = 1, seed: int | None = None) -> Recorder:
    sink = Recorder(n)
    prompt = engine.tokenizer("Write a poem about the sea.")["input_ids"]
    temperature = 0.0 if seed is None else 1.0
    params = RequestParams(SamplingParams(temperature=temperature, seed=seed),
                           StoppingParams(max_tokens=MAX_TOKENS, ignore_eos=True), n=n)
    engine.submit(Request(f"interval-{id(sink)}", prompt, params, max_tokens=MAX_TOKENS, sink=sink))
    return sink


def generate(engine: Engine, interval: int, n: int = 1, seed: int | None = None) -> Recorder:
    engine.core.pacing.interval = interval
    sink = submit(engine, n, seed)
    run_until_done(engine, [sink])
    return sink


@pytest.mark.model
def test_tokens_go_out_every_n_steps_with_the_first_at_once(engine) -> None:
    every, grouped = generate(engine, 1), generate(engine, 4)
    assert [len(c.token_ids) for c in every.chunks()] == [1] * MAX_TOKENS
    # The first token alone (time to first token unchanged), then 4 steps' tokens per message,
    # the remainder with the final.
    assert [len(c.token_ids) for c in grouped.chunks()] == [1, 4, 4, 4]
    assert [t for c in grouped.chunks() for t in c.token_ids] == [t for c in every.chunks() for t in c.token_ids]
    assert "".join(c.text for c in grouped.chunks()) == "".join(c.text for c in every.chunks())
    assert isinstance(grouped.calls[-1][-1], FinalEvent)
    assert grouped.calls[-1][-1].finish_reason is FinishReason.LENGTH
    assert grouped.calls[-1][-1].completion_tokens == MAX_TOKENS


@pytest.mark.model
def test_every_choice_of_a_request_is_grouped_and_completed(engine) -> None:
    every, grouped = generate(engine, 1, n=2, seed=7), generate(engine, 4, n=2, seed=7)
    for index in (0, 1):
        assert [t for c in grouped.chunks(index) for t in c.token_ids] == \
               [t for c in every.chunks(index) for t in c.token_ids]
        assert len(grouped.chunks(index)) < len(every.chunks(index))
    assert len(grouped.calls) < len(every.calls)


def test_auto_groups_only_past_eight_requests_a_step_and_at_most_four_steps() -> None:
    assert [auto_stream_interval(n) for n in (1, 8, 9, 16, 17, 24, 25, 32, 64)] == [1, 1, 2, 2, 3, 3, 4, 4, 4]


@pytest.mark.model
def test_auto_sends_every_token_of_a_lone_stream(engine) -> None:
    assert [len(c.token_ids) for c in generate(engine, 0).chunks()] == [1] * MAX_TOKENS


@pytest.mark.model
def test_auto_groups_tokens_when_many_streams_run(engine) -> None:
    """17 streams at once: once they step together, each message holds 3 steps' tokens
    (ceil(17 / 8)); nothing is lost and the first token still goes alone."""
    engine.core.pacing.interval = 0
    sinks = [submit(engine) for _ in range(17)]
    run_until_done(engine, sinks)
    for sink in sinks:
        sizes = [len(c.token_ids) for c in sink.chunks()]
        assert sum(sizes) == MAX_TOKENS and sizes[0] == 1
        assert max(sizes) <= 3 and sizes.count(3) >= 2, sizes
        assert isinstance(sink.calls[-1][-1], FinalEvent)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_the_interval_must_be_a_positive_whole_number(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--stream-interval", value])
    assert "--stream-interval" in capsys.readouterr().err


def test_the_interval_defaults_to_auto() -> None:
    assert parse_args([]).stream_interval == 0 == EngineConfig().stream_interval
    assert parse_args(["--stream-interval", "auto"]).stream_interval == 0
    assert parse_args(["--stream-interval", "3"]).stream_interval == 3


@pytest.fixture(scope="module")
def grouped_client() -> Iterator[openai.OpenAI]:
    """The openai SDK against a stack whose engine sends every 3 steps' tokens in one message."""
    with Stack(engine_args=["--stream-interval", "3"], startup_timeout=STARTUP_TIMEOUT_S) as stack, \
            openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.mark.model
def test_grouped_chat_stream_carries_what_the_whole_answer_does(grouped_client) -> None:
    """Through the shim, a chunk holds several tokens' text and logprobs; joined, they are the
    non-streamed answer's."""
    args = dict(model=grouped_client.models.list().data[0].id, max_tokens=MAX_TOKENS, temperature=0,
                logprobs=True, top_logprobs=2, messages=[{"role": "user", "content": "Write a poem about the sea."}])
    whole = grouped_client.chat.completions.create(**args).choices[0]
    chunks = [c for c in grouped_client.chat.completions.create(stream=True, **args) if c.choices]
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert "".join(texts) == whole.message.content
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in whole.logprobs.content]
    assert [len(e.top_logprobs) for e in entries] == [2] * len(entries)
    assert max(len(c.choices[0].logprobs.content) for c in chunks if c.choices[0].logprobs) == 3
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


@pytest.mark.model
def test_grouped_completion_stream_offsets_follow_the_text(grouped_client) -> None:
    args = dict(model=grouped_client.models.list().data[0].id, prompt="The sea is", max_tokens=MAX_TOKENS,
                temperature=0, logprobs=1)
    whole = grouped_client.completions.create(**args).choices[0]
    chunks = [c.choices[0] for c in grouped_client.completions.create(stream=True, **args) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert tokens == whole.logprobs.tokens and offsets == whole.logprobs.text_offset
