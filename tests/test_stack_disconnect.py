"""A client that leaves mid-stream frees the engine.

The engine under test runs one sequence at a time, and the abandoned request
would run to the end of the context (EOS is banned), so the follow-up request
can only finish within its timeout if the shim relayed the disconnect and the
engine stopped generating.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from clients import EngineClient
from launcher.stack import Stack
from common import MODEL, QUESTION, STORY, ask, text_of

pytestmark = pytest.mark.model

# Well below the minutes the abandoned generation would take to fill the context.
FOLLOW_UP_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def single_slot_client(single_slot_stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=single_slot_stack.base_url, api_key="unused", max_retries=0,
                       timeout=FOLLOW_UP_TIMEOUT_S) as client:
        yield client


def endless_params(stack: Stack, messages: list[dict[str, str]]) -> dict:
    """max_tokens filling the context and a logit_bias banning EOS: a generation that runs for minutes."""
    with EngineClient(stack.engine_address, timeout=30) as engine:
        info = engine.model_info()
        prompt_tokens = len(engine.tokenize(messages=messages).token_ids)
    return {"max_tokens": info.max_context_length - prompt_tokens - 1,
            "logit_bias": {str(token): -100 for token in info.eos_token_ids}}


def follow_up_answer(client: openai.OpenAI) -> str:
    """A short request that only fits in its timeout if the engine's one slot was freed.

    A 429 is retried for a while: the shim notices that a *waiting* stream's client left only at
    that stream's next heartbeat, so abandoned requests can fill the queue for a few seconds.
    """
    give_up = time.monotonic() + FOLLOW_UP_TIMEOUT_S
    while True:
        try:
            return text_of(ask(client))
        except openai.APITimeoutError:
            pytest.fail(f"no answer within {FOLLOW_UP_TIMEOUT_S}s: the abandoned generation still holds the engine")
        except openai.RateLimitError:
            if time.monotonic() > give_up:
                raise
            time.sleep(1)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_disconnect_mid_stream_frees_the_engine(single_slot_stack: Stack, single_slot_client: openai.OpenAI,
                                                endpoint: str) -> None:
    params = endless_params(single_slot_stack, STORY)
    if endpoint == "chat":
        stream = single_slot_client.chat.completions.create(model=MODEL, messages=STORY, stream=True, **params)
    else:
        stream = single_slot_client.completions.create(model=MODEL, prompt="Once upon a time", stream=True,
                                                       **params)
    chunks = iter(stream)
    for _ in range(5):
        next(chunks)
    stream.close()  # drops the HTTP connection mid-stream

    assert "Paris" in follow_up_answer(single_slot_client)
    single_slot_stack.check_alive()


def test_full_queue_is_429_with_retry_after(single_slot_stack: Stack, single_slot_client: openai.OpenAI) -> None:
    params = endless_params(single_slot_stack, STORY)
    streams = [single_slot_client.chat.completions.create(model=MODEL, messages=STORY, stream=True, **params)
               for _ in range(3)]  # one running, two waiting: the queue is full
    try:
        next(iter(streams[0]))
        with pytest.raises(openai.RateLimitError) as caught:
            single_slot_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5)
        assert caught.value.status_code == 429
        assert int(caught.value.response.headers["retry-after"]) >= 0
    finally:
        for stream in streams:
            stream.close()
    assert "Paris" in follow_up_answer(single_slot_client)


def test_client_timeout_on_a_non_streamed_request_frees_the_engine(single_slot_stack: Stack,
                                                                    single_slot_client: openai.OpenAI) -> None:
    # Nothing is written to a non-streamed response until the end, so the shim must notice the
    # disconnect while the engine is busy producing tokens, not only while it is idle.
    params = endless_params(single_slot_stack, STORY)
    with pytest.raises(openai.APITimeoutError):
        single_slot_client.with_options(timeout=3).chat.completions.create(model=MODEL, messages=STORY, **params)

    assert "Paris" in follow_up_answer(single_slot_client)
