"""Chat completions through the official openai SDK against the real stack, at temperature 0.

Each request field on its own is in test_fidelity_fields.py; this file holds the response's shape,
streaming and usage.
"""

from __future__ import annotations

import openai
import pytest

from clients import EngineClient
from common import ANSWER, MODEL, QUESTION, ask, streamed_text, text_of

pytestmark = pytest.mark.model


def test_capital_of_france(openai_client: openai.OpenAI) -> None:
    """The greedy answer the other tests compare with, in OpenAI's shape, ended by EOS."""
    response = ask(openai_client)
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == MODEL
    assert len(response.choices) == 1
    assert response.choices[0].index == 0
    assert response.choices[0].message.role == "assistant"
    assert (text_of(response), response.choices[0].finish_reason) == (ANSWER, "stop")


def test_streamed_text_equals_non_streamed(openai_client: openai.OpenAI) -> None:
    whole = ask(openai_client)
    text, finish = streamed_text(ask(openai_client, stream=True))
    assert text == text_of(whole)
    assert finish == whole.choices[0].finish_reason


def test_stream_chunks_shape(openai_client: openai.OpenAI) -> None:
    chunks = list(ask(openai_client, stream=True, max_tokens=5))
    assert chunks, "no chunks"
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.usage is None for chunk in chunks)  # only with stream_options.include_usage
    assert chunks[-1].choices[0].finish_reason == "length"


def test_usage_counts(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    response = ask(openai_client, max_tokens=6)
    prompt_ids = engine_client.tokenize(messages=QUESTION).token_ids
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == len(prompt_ids) + 6


def test_include_usage_chunk(openai_client: openai.OpenAI) -> None:
    whole = ask(openai_client)
    chunks = list(ask(openai_client, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.total_tokens == whole.usage.total_tokens
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_greedy_n_choices_are_identical(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, n=2, max_tokens=5)
    assert [choice.index for choice in response.choices] == [0, 1]
    # Greedy decoding: both choices are the same text.
    assert response.choices[0].message.content == response.choices[1].message.content
    assert response.usage.completion_tokens == 10


def test_a_prompt_longer_than_one_step_on_an_idle_engine(openai_client: openai.OpenAI) -> None:
    """Its first steps prefill chunks that keep no logits at all (found by the fuzzer: a 500)."""
    response = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello " * 600}], max_tokens=4, temperature=0)
    assert response.usage.prompt_tokens > 512, "longer than the default step budget"
    assert response.choices[0].finish_reason in ("stop", "length")
