"""Chat completions through the official openai SDK against the real stack, at temperature 0."""

from __future__ import annotations

import openai
import pytest

from clients import EngineClient

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def ask(client: openai.OpenAI, **params):
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          max_tokens=params.pop("max_tokens", 30), **params)


def streamed_text(chunks) -> tuple[str, str | None]:
    """The text and last finish_reason of a streamed single choice."""
    text, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def test_capital_of_france(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client)
    assert response.object == "chat.completion"
    assert response.model == MODEL
    assert len(response.choices) == 1
    message = response.choices[0].message
    assert message.role == "assistant"
    assert "Paris" in message.content
    assert response.choices[0].finish_reason in ("stop", "length")


def test_streamed_text_equals_non_streamed(openai_client: openai.OpenAI) -> None:
    whole = ask(openai_client)
    text, finish = streamed_text(ask(openai_client, stream=True))
    assert text == whole.choices[0].message.content
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


def test_stop_string_cuts_the_text(openai_client: openai.OpenAI) -> None:
    full = ask(openai_client).choices[0].message.content
    assert "Paris" in full
    stopped = ask(openai_client, stop=["Paris"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == full[: full.index("Paris")]
    streamed, finish = streamed_text(ask(openai_client, stop=["Paris"], stream=True))
    assert (streamed, finish) == (stopped.choices[0].message.content, "stop")


def test_max_tokens_gives_length(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, max_tokens=3)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 3
    _, finish = streamed_text(ask(openai_client, max_tokens=3, stream=True))
    assert finish == "length"


def test_n_choices(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, n=2, max_tokens=5)
    assert [choice.index for choice in response.choices] == [0, 1]
    # Greedy decoding: both choices are the same text.
    assert response.choices[0].message.content == response.choices[1].message.content
    assert response.usage.completion_tokens == 10
