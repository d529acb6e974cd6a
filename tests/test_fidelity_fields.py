"""Every other request field through the openai SDK: each one must change the output as OpenAI
(or, for `extra_body` vendor fields, vLLM) defines it, or be accepted where it has no meaning here."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from clients import EngineClient
from common import ANSWER, MODEL, PROMPT, QUESTION, ask, streamed_text, text_of

pytestmark = pytest.mark.model

POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


def single_token(engine_client: EngineClient, text: str) -> int:
    (token,) = engine_client.tokenize(text).token_ids
    return token


# ------------------------------------------------------------------ n, seed


def test_streamed_choices_are_multiplexed_by_index(openai_client: openai.OpenAI) -> None:
    params = dict(messages=POEM, temperature=1, seed=11, n=3, max_tokens=6)
    whole = ask(openai_client, **params)
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    roles: dict[int, str] = {}
    chunks = list(ask(openai_client, **params, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        if choice.index not in roles:
            roles[choice.index] = choice.delta.role
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        if choice.finish_reason:
            finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert finishes == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert texts == {choice.index: choice.message.content for choice in whole.choices}
    assert len(set(texts.values())) > 1, "each choice must draw its own sample"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 18


def test_seed_repeats_a_sampled_answer(openai_client: openai.OpenAI) -> None:
    first, again = (text_of(ask(openai_client, messages=POEM, temperature=1, seed=123, max_tokens=8))
                    for _ in range(2))
    assert first == again
    others = {text_of(ask(openai_client, messages=POEM, temperature=1, seed=s, max_tokens=8)) for s in (1, 2, 3)}
    assert len(others | {first}) > 1, "different seeds should not all sample the same text"


# ------------------------------------------------------------------ stopping


def test_stop_as_a_string(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, stop="Paris")
    assert (text_of(response), response.choices[0].finish_reason) == ("The capital of France is ", "stop")


def test_stop_as_a_list_stops_at_the_first_match(openai_client: openai.OpenAI) -> None:
    stop = ["never appears", "France", "Paris"]
    response = ask(openai_client, stop=stop)
    assert (text_of(response), response.choices[0].finish_reason) == ("The capital of ", "stop")
    assert streamed_text(ask(openai_client, stop=stop, stream=True)) == ("The capital of ", "stop")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_token_limit_gives_length(openai_client: openai.OpenAI, field: str) -> None:
    request = {"model": MODEL, "messages": QUESTION, "temperature": 0, field: 4}
    response = openai_client.chat.completions.create(**request)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 4
    assert ANSWER.startswith(text_of(response))
    streamed = openai_client.chat.completions.create(**request, stream=True)
    assert streamed_text(streamed) == (text_of(response), "length")


# ------------------------------------------------------------------ sampling


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_penalties_change_a_repetitive_answer(openai_client: openai.OpenAI, penalty: str) -> None:
    # 32 tokens: the greedy poem repeats itself ("A creature of the deep, a creature of") within them;
    # its first 16 tokens repeat nothing, so a penalty has nothing to change there.
    plain = text_of(ask(openai_client, messages=POEM, max_tokens=32))
    penalised = text_of(ask(openai_client, messages=POEM, max_tokens=32, **{penalty: 2.0}))
    assert penalised != plain


def test_logit_bias_forces_a_token(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    banana = single_token(engine_client, " banana")
    response = ask(openai_client, max_tokens=3, logit_bias={str(banana): 100})
    assert text_of(response) == " banana" * 3


def test_logit_bias_bans_a_token(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    paris = single_token(engine_client, " Paris")
    text = text_of(ask(openai_client, max_tokens=10, logit_bias={str(paris): -100}))
    assert text.startswith("The capital of France is") and " Paris" not in text


# ------------------------------------------------------------------ messages and accepted fields


def test_accepted_and_ignored_fields(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, user="user-42", metadata={"team": "search"}, store=False,
                   service_tier="auto", extra_body={"prompt_cache_key": "k"})
    assert text_of(response) == ANSWER


def test_developer_role_acts_as_system(openai_client: openai.OpenAI) -> None:
    rule = "Always answer in one word."
    as_system = ask(openai_client, messages=[{"role": "system", "content": rule}, *QUESTION])
    as_developer = ask(openai_client, messages=[{"role": "developer", "content": rule}, *QUESTION])
    assert text_of(as_developer) == text_of(as_system)
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens


def test_message_name_is_accepted(openai_client: openai.OpenAI) -> None:
    response = ask(openai_client, messages=[{"role": "user", "name": "alice", "content": QUESTION[0]["content"]}])
    assert response.choices[0].finish_reason in ("stop", "length") and text_of(response)


def test_content_as_text_parts(openai_client: openai.OpenAI) -> None:
    parts = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]
    as_parts = ask(openai_client, messages=[{"role": "user", "content": parts}])
    joined = ask(openai_client, messages=[{"role": "user", "content": "What is the capital\nof France?"}])
    assert text_of(as_parts) == text_of(joined)
    assert as_parts.usage.prompt_tokens == joined.usage.prompt_tokens


# ------------------------------------------------------------------ vendor fields (extra_body)


@pytest.mark.parametrize("extra", [{"top_k": 1}, {"min_p": 1.0}], ids=["top_k", "min_p"])
def test_filters_that_leave_one_token_are_greedy(openai_client: openai.OpenAI, extra: dict) -> None:
    response = ask(openai_client, temperature=1, extra_body=extra)
    assert text_of(response) == ANSWER


def test_repetition_penalty_changes_the_answer(openai_client: openai.OpenAI) -> None:
    plain = text_of(ask(openai_client, messages=POEM, max_tokens=16))
    penalised = text_of(ask(openai_client, messages=POEM, max_tokens=16, extra_body={"repetition_penalty": 1.5}))
    assert penalised != plain


@pytest.mark.parametrize("extra", [{"min_tokens": 12}, {"ignore_eos": True}])
def test_generation_past_eos(openai_client: openai.OpenAI, extra: dict) -> None:
    response = ask(openai_client, max_tokens=12, extra_body=extra)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 12
    assert text_of(response).startswith(ANSWER)


def test_stop_token_ids(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    paris = single_token(engine_client, " Paris")
    response = ask(openai_client, extra_body={"stop_token_ids": [paris]})
    assert response.choices[0].finish_reason == "stop"
    assert text_of(response).startswith("The capital of France is")
    assert "Paris" not in text_of(response)


# ------------------------------------------------------------------ completions


def complete(client: openai.OpenAI, prompt: Any, **params: Any):
    return client.completions.create(**{"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 4, **params})


def test_completion_prompt_forms(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    other = "One, two, three,"
    expected = [complete(openai_client, p).choices[0].text for p in (PROMPT, other)]
    ids = [list(engine_client.tokenize(p).token_ids) for p in (PROMPT, other)]
    for prompt in ([PROMPT, other], ids):
        response = complete(openai_client, prompt)
        assert [c.index for c in response.choices] == [0, 1]
        assert [c.text for c in response.choices] == expected
    assert complete(openai_client, ids[0]).choices[0].text == expected[0]


def test_completion_prompts_times_n(openai_client: openai.OpenAI) -> None:
    response = complete(openai_client, [PROMPT, "One, two, three,"], n=2)
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.choices[0].text == response.choices[1].text  # greedy


def test_completion_best_of_with_n(openai_client: openai.OpenAI) -> None:
    response = complete(openai_client, PROMPT, temperature=1, seed=5, best_of=3, n=2)
    assert [c.index for c in response.choices] == [0, 1]
    assert all(c.finish_reason in ("stop", "length") for c in response.choices)


def test_completion_stop_with_and_without_echo(openai_client: openai.OpenAI) -> None:
    response = complete(openai_client, PROMPT, stop=".", max_tokens=6)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (" Paris", "stop")
    response = complete(openai_client, PROMPT, stop=".", echo=True, max_tokens=6)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (PROMPT + " Paris", "stop")


def test_completion_max_tokens_default_is_16(openai_client: openai.OpenAI) -> None:
    response = openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0,
                                                extra_body={"ignore_eos": True})
    assert response.usage.completion_tokens == 16 and response.choices[0].finish_reason == "length"
