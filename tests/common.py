"""What the end-to-end tests share: the default model's id, the standard questions and their greedy
answer, and helpers to ask them through the openai SDK and read streamed answers."""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the fast tier's modules import this one: the SDK is theirs to import when used
    import openai

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = "The capital of France is Paris."  # the default model's greedy answer to QUESTION, ended by EOS
PROMPT = "The capital of France is"  # for /v1/completions
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ASK_MAX_TOKENS = 30  # room for ANSWER: a greedy ask() ends with finish_reason "stop"


def chat_request(**params: Any) -> dict[str, Any]:
    """QUESTION to MODEL at temperature 0 within ASK_MAX_TOKENS; `params` add or override fields."""
    return {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": ASK_MAX_TOKENS, **params}


def ask(client: openai.OpenAI, **params: Any) -> Any:
    """A chat completion (or, with stream=True, its stream) of `chat_request(**params)`."""
    return client.chat.completions.create(**chat_request(**params))


async def ask_async(client: openai.AsyncOpenAI, **params: Any) -> Any:
    return await client.chat.completions.create(**chat_request(**params))


def text_of(response: Any) -> str:
    """The message text of a chat completion's first choice."""
    return response.choices[0].message.content


def streamed_texts(chunks: Any) -> tuple[dict[int, str], dict[int, str]]:
    """Per choice index of a streamed chat completion: the text and the finish_reason."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return texts, finishes


def streamed_text(chunks: Any) -> tuple[str, str | None]:
    """The text and finish_reason of a streamed single choice."""
    texts, finishes = streamed_texts(chunks)
    assert set(texts) <= {0}, f"expected one choice, got indexes {sorted(texts)}"
    return texts.get(0, ""), finishes.get(0)


# A request computed twice is not always bit-identical: a preemption or a failed step's rewind
# recomputes tokens that decode steps computed, through the prefill path, which rounds differently
# (a prefix-cache hit alone is bit-exact: tests/test_numerics.py). Logprobs may move by
# rounding (up to ~0.13 seen on the default model); where the best two tokens are closer than
# that, greedy may go either way. A real fault (wrong K/V) moves logprobs by nats.
RECOMPUTE_LOGPROB_TOLERANCE = 0.15


def assert_same_greedy_until_near_tie(reference: list[Any], other: list[Any]) -> int:
    """Greedy logprobs (`TokenLogprob`s with top_logprobs >= 2) of the same request computed twice:
    the same tokens, with logprobs within RECOMPUTE_LOGPROB_TOLERANCE, up to the reference's first
    near-tie. Returns how many tokens were compared."""
    compared = 0
    for ref, got in zip(reference, other, strict=True):
        if ref.top_logprobs[0].logprob - ref.top_logprobs[1].logprob < RECOMPUTE_LOGPROB_TOLERANCE:
            break  # from here on, the two may legitimately go different ways
        assert got.token_id == ref.token_id, f"token {compared} differs before any near-tie"
        assert abs(got.logprob - ref.logprob) <= RECOMPUTE_LOGPROB_TOLERANCE, f"token {compared}'s logprob moved"
        compared += 1
    return compared


class _LazyModule(types.ModuleType):
    """A module imported at the first use of one of its public names: collectors probe every name
    in a test module (pytest's `__test__`, plugins' private marks), and those probes must not import it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(importlib.import_module(self.__name__), name)


def lazy_module(name: str) -> types.ModuleType:
    """`name`, imported at its first use: an SDK only some tests of a module use costs its import
    (~1 s for anthropic, the Agents SDK or pydantic-ai) to those tests, not to every test run's
    collection (each xdist worker collects every module)."""
    return _LazyModule(name)
