"""n-gram speculative decoding (core/speculation.py, on by default): drafts from a sequence's own tokens,
checked in the step that decodes it. The output is the one decoding without drafts gives: the same greedy
tokens and logprobs, the same tokens for a seeded sampled request, the same stops, grammars and choices;
the session stack (the defaults: drafting) checked against one started with `--speculative-config off`, on
the real default model."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest
from conftest import STARTUP_TIMEOUT_S

from common import MODEL
from launcher.stack import Stack

pytestmark = pytest.mark.model

PASSAGE = ("The lighthouse stood at the edge of the cliff, its white paint peeling in long strips. Every night "
           "the keeper climbed the spiral stairs, lit the great lamp, and watched the beam sweep across the dark "
           "water. Ships passed far out at sea, their lights small and steady, and none of them knew his name.")
FUNCTION = ("def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
            "    return width * height\n")
QUOTE = f"Repeat this passage exactly, word for word:\n\n{PASSAGE}"
CODE = f"Fix the typo in this code and show the whole code:\n\n{FUNCTION.replace('height)', 'heigth)', 1)}"
STORY = "Write a short story about a cat who learns to fly."
PROMPTS = {"quote": QUOTE, "code": CODE, "no repeats": STORY}


@pytest.fixture(scope="module")
def plain() -> Iterator[Stack]:
    """A stack that never drafts."""
    with Stack(engine_args=["--speculative-config", "off"], startup_timeout=STARTUP_TIMEOUT_S) as stack:
        yield stack


@pytest.fixture
def speculating(stack: Stack) -> Stack:
    """The session stack, which drafts by default."""
    return stack


def openai_client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=180)


def chat(stack: Stack, prompt: str, stream: bool = False, **params) -> tuple[str, list]:
    """The answer's text and its logprobs entries (token, logprob, top)."""
    args = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64, "temperature": 0,
            **params}
    with openai_client(stack) as client:
        if not stream:
            choice = client.chat.completions.create(**args).choices[0]
            entries = choice.logprobs.content if choice.logprobs else []
            return choice.message.content, [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in entries]
        chunks = [c for c in client.chat.completions.create(stream=True, **args) if c.choices]
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    return ("".join(c.choices[0].delta.content or "" for c in chunks),
            [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in entries])


def accepted_tokens(stack: Stack) -> float:
    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^conduit:spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", PROMPTS)
def test_greedy_chat_is_the_same_with_and_without_drafts(plain: Stack, speculating: Stack, kind: str,
                                                        stream: bool) -> None:
    before = accepted_tokens(speculating)
    assert chat(speculating, PROMPTS[kind], stream) == chat(plain, PROMPTS[kind], stream)
    if kind != "no repeats":
        assert accepted_tokens(speculating) > before, "drafts were taken"


def test_logprobs_are_the_targets_own(plain: Stack, speculating: Stack) -> None:
    with_drafts = chat(speculating, QUOTE, logprobs=True, top_logprobs=3)
    assert with_drafts == chat(plain, QUOTE, logprobs=True, top_logprobs=3)
    assert len(with_drafts[1]) == 64


def test_seeded_sampling_at_temperature_1_draws_the_same_tokens(plain: Stack, speculating: Stack) -> None:
    """Each token is sampled from the model's distribution as without drafts, one draw of the
    request's own generator per token: the same seed gives the same tokens (so the same frequencies)."""
    def both(seed: int) -> tuple:  # the four seeds at once: up to 8 decode rows, each row's bits its own
        params = dict(temperature=1.0, top_p=0.95, seed=seed, max_tokens=32)
        return chat(speculating, QUOTE, **params), chat(plain, QUOTE, **params)

    with ThreadPoolExecutor(4) as pool:
        for seed, (drafted, undrafted) in enumerate(pool.map(both, range(4))):
            assert drafted == undrafted, seed


def test_a_stop_string_and_max_tokens_inside_a_draft_end_where_they_would(plain: Stack, speculating: Stack) -> None:
    for params in (dict(stop=["spiral"]), dict(stop=["lamp,"]), dict(max_tokens=23), dict(max_tokens=1)):
        with openai_client(speculating) as spec, openai_client(plain) as without:
            args = dict(model=MODEL, messages=[{"role": "user", "content": QUOTE}], temperature=0, max_tokens=64)
            args.update(params)
            got, want = spec.chat.completions.create(**args), without.chat.completions.create(**args)
        assert (got.choices[0].message.content, got.choices[0].finish_reason, got.usage.completion_tokens) == \
               (want.choices[0].message.content, want.choices[0].finish_reason, want.usage.completion_tokens), params


def test_a_json_schema_and_n_choices_keep_their_output(plain: Stack, speculating: Stack) -> None:
    schema = {"type": "object", "properties": {"passage": {"type": "string"}}, "required": ["passage"],
              "additionalProperties": False}
    params = dict(response_format={"type": "json_schema", "json_schema": {"name": "quote", "schema": schema}})
    assert chat(speculating, QUOTE, **params) == chat(plain, QUOTE, **params)
    with openai_client(speculating) as spec, openai_client(plain) as without:
        args = dict(model=MODEL, messages=[{"role": "user", "content": CODE}], temperature=0, max_tokens=48, n=2)
        got = [c.message.content for c in spec.chat.completions.create(**args).choices]
        assert got == [c.message.content for c in without.chat.completions.create(**args).choices]
        assert got[0] == got[1]


def test_responses_and_messages_say_the_same_with_drafts(plain: Stack, speculating: Stack) -> None:
    def responses(target: Stack) -> str:
        with openai_client(target) as client:
            return client.responses.create(model=MODEL, input=QUOTE, max_output_tokens=48, temperature=0).output_text

    def messages(target: Stack) -> str:
        with anthropic.Anthropic(base_url=target.shim_url, api_key="unused", max_retries=0, timeout=180) as client:
            reply = client.messages.create(model=MODEL, max_tokens=48, extra_body={"temperature": 0},  # this SDK
                                           messages=[{"role": "user", "content": CODE}])  # takes no temperature
            return "".join(block.text for block in reply.content if block.type == "text")

    assert responses(speculating) == responses(plain)
    assert messages(speculating) == messages(plain)
