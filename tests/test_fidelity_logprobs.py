"""Logprobs through the openai SDK: chat (token, logprob, bytes, sorted top_logprobs; streamed too)
and legacy completions (tokens, token_logprobs, top_logprobs, text_offset; with echo)."""

from __future__ import annotations

import math

import openai
import pytest

from clients import EngineClient
from common import MODEL, PROMPT, ask

pytestmark = pytest.mark.model

TOLERANCE = 1e-4


def chat(client: openai.OpenAI, **params):
    return ask(client, max_tokens=6, logprobs=True, **params)


def assert_chat_entry(entry, top: int) -> None:
    assert isinstance(entry.token, str)
    assert entry.logprob <= 0
    assert all(0 <= b <= 255 for b in entry.bytes)
    if "\ufffd" not in entry.token:  # a whole character: its UTF-8 bytes
        assert entry.bytes == list(entry.token.encode())
    assert len(entry.top_logprobs) == top
    values = [alt.logprob for alt in entry.top_logprobs]
    assert values == sorted(values, reverse=True)
    assert len({alt.token for alt in entry.top_logprobs}) == top
    for alt in entry.top_logprobs:
        assert alt.logprob <= 0 and alt.bytes is not None
    if top:  # greedy: the chosen token is (one of) the most likely
        assert entry.logprob >= values[0] - TOLERANCE


@pytest.mark.parametrize("top", [0, 3, 20])
def test_chat_logprobs(openai_client: openai.OpenAI, top: int) -> None:
    response = chat(openai_client, top_logprobs=top)
    choice = response.choices[0]
    content = choice.logprobs.content
    assert len(content) == response.usage.completion_tokens == 6
    for entry in content:
        assert_chat_entry(entry, top)
    # The tokens' bytes spell the text exactly.
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == choice.message.content


def test_chat_without_logprobs_has_none(openai_client: openai.OpenAI) -> None:
    assert ask(openai_client, max_tokens=3).choices[0].logprobs is None


def test_streamed_chat_logprobs_match(openai_client: openai.OpenAI) -> None:
    whole = chat(openai_client, top_logprobs=2).choices[0].logprobs.content
    streamed = []
    for chunk in chat(openai_client, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed.extend(choice.logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in whole]
    for got, expected in zip(streamed, whole):
        assert_chat_entry(got, 2)
        assert math.isclose(got.logprob, expected.logprob, abs_tol=TOLERANCE)
        assert [alt.token for alt in got.top_logprobs] == [alt.token for alt in expected.top_logprobs]


def test_completion_logprobs(openai_client: openai.OpenAI) -> None:
    response = openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    choice = response.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == choice.text
    for token, offset in zip(lp.tokens, lp.text_offset):
        assert choice.text[offset:offset + len(token)] == token
    for value, alternatives in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0
        assert 1 <= len(alternatives) <= 4  # OpenAI allows the sampled token beside the `logprobs` best
        assert value >= max(alternatives.values()) - TOLERANCE


def test_completion_echo_with_logprobs(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    prompt_tokens = list(engine_client.tokenize(PROMPT).tokens)
    response = openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                                logprobs=1, echo=True)
    choice = response.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT)
    assert len(lp.tokens) == response.usage.prompt_tokens + response.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    # The prompt's first token has no logprob (nothing precedes it); the others do.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(value is not None and value <= 0 for value in lp.token_logprobs[1:])
    assert len(prompt_tokens) == response.usage.prompt_tokens


def test_completion_echo_streamed(openai_client: openai.OpenAI) -> None:
    params = dict(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    whole = openai_client.completions.create(**params).choices[0]
    chunks = list(openai_client.completions.create(**params, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == whole.logprobs.tokens
    assert offsets == whole.logprobs.text_offset


def test_completion_echo_of_token_ids(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    ids = list(engine_client.tokenize(PROMPT).token_ids)
    by_ids = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, echo=True)
    by_text = openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.choices[0].text.startswith(PROMPT)


def test_echo_with_zero_max_tokens_scores_the_prompt(openai_client: openai.OpenAI) -> None:
    """How evaluation harnesses score a text: echo it with logprobs and generate nothing."""
    response = openai_client.completions.create(model=MODEL, prompt="The capital of France is Paris.",
                                                max_tokens=0, echo=True, logprobs=1)
    choice = response.choices[0]
    assert choice.text == "The capital of France is Paris."
    assert response.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == response.usage.prompt_tokens
