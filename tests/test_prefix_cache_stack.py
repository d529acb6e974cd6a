"""Prefix caching on the real stack and default model: a warm cache changes nothing but the
work done, and the hits show in usage (gRPC and OpenAI's usage.prompt_tokens_details)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from clients import EngineClient
from launcher.stack import Stack
from engine_service.core.config import EngineConfig
from conduit_common.results import Completion, CompletionBuilder
from conduit.v1 import engine_pb2 as pb
from common import MODEL

pytestmark = pytest.mark.model

SEGMENTS = EngineConfig().segments  # a hit ends on a prompt segment's boundary (model/step.py)
RULES = ("Answer in one short sentence. Be polite and precise. Never invent facts; say so when unsure. "
         "Prefer plain words over jargon, and give numbers with their units. ") * 4


def unique_system() -> str:
    """A system prompt no earlier request has sent (its first block differs), about 150 tokens."""
    return f"Conversation {uuid.uuid4().hex}. {RULES}"


def complete(client: EngineClient, text: str) -> Completion:
    """A greedy completion with logprobs; checks that every Chunk and Final repeats the prompt's count."""
    request = pb.GenerateRequest(text=text, logprobs=True,
                                 sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=24, ignore_eos=True))
    builder = CompletionBuilder()
    counts = set()
    for response in client.generate(request):
        builder.add(response)
        kind = response.WhichOneof("kind")
        if kind in ("chunk", "final"):
            counts.add(getattr(response, kind).cached_tokens)
    completion = builder.build()
    assert counts == {completion.prompt.cached_tokens}
    return completion


def test_a_warm_cache_gives_the_same_greedy_tokens_and_logprobs(engine_client: EngineClient) -> None:
    # A fixed prompt, so the comparison is the same every run (no other test sends it: the cold run is cold).
    text = f"Conversation about the sky. {RULES}Question: why is the sky blue?"
    cold, warm = (complete(engine_client, text) for _ in range(2))
    prompt_tokens = cold.prompt.prompt_tokens
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == SEGMENTS.floor((prompt_tokens - 1) // 16 * 16) > 0, \
        "all full blocks short of the last token, to a segment's boundary"
    # Bit for bit: the warm prefill runs the cold one's calls from its segment on (model/step.py).
    assert warm.choices[0].token_ids == cold.choices[0].token_ids
    assert [lp.logprob for lp in warm.choices[0].logprobs] == [lp.logprob for lp in cold.choices[0].logprobs]


CHATS = ["Write a poem about the sea.", "Explain why the sky is blue.", "List five fruits and their colors.",
         "Tell a short story about a robot.", "How do I boil an egg?", "Describe a busy city street at night."]


@pytest.mark.parametrize("prompt", CHATS)
def test_a_chat_at_temperature_0_says_the_same_whole_and_then_streamed(openai_client: openai.OpenAI,
                                                                      prompt: str) -> None:
    """The first thing users compare: the streamed request finds its prompt cached by the whole one."""
    args = dict(model=MODEL, temperature=0, max_tokens=48, messages=[
        {"role": "system", "content": unique_system()}, {"role": "user", "content": prompt}])
    whole = openai_client.chat.completions.create(**args)
    stream = openai_client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0, "the streamed prompt was cached"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


def chat_turns(client: openai.OpenAI) -> tuple[openai.types.CompletionUsage, openai.types.CompletionUsage]:
    """Two turns of one conversation (the second streamed with its usage chunk): their usages."""
    messages = [{"role": "system", "content": unique_system()},
                {"role": "user", "content": "Name a large city in France."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=20)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And one in Spain?"}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=20,
                                            stream=True, stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1
    return first.usage, usage[0]


def test_the_next_turn_of_a_chat_reports_its_cached_prompt_tokens(openai_client: openai.OpenAI) -> None:
    first, second = chat_turns(openai_client)
    assert first.prompt_tokens_details.cached_tokens == 0
    # The first turn's prompt blocks, at least; the answer re-sent may add more.
    assert second.prompt_tokens_details.cached_tokens >= SEGMENTS.floor((first.prompt_tokens - 1) // 16 * 16) > 0
    assert second.prompt_tokens_details.cached_tokens < second.prompt_tokens


def test_completions_report_cached_tokens(openai_client: openai.OpenAI) -> None:
    prompt = unique_system() + "The capital of France is"
    usages = [openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0).usage
              for _ in range(2)]
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens > 0


@pytest.fixture(scope="module")
def uncached_stack() -> Iterator[Stack]:
    with Stack(engine_args=["--no-enable-prefix-caching"], startup_timeout=180) as running:
        yield running


def test_with_prefix_caching_off_nothing_is_cached(uncached_stack: Stack) -> None:
    with openai.OpenAI(base_url=uncached_stack.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        first, second = chat_turns(client)
    assert first.prompt_tokens_details.cached_tokens == second.prompt_tokens_details.cached_tokens == 0
