"""What the end-to-end tests share: the default model's id, the standard questions and their greedy
answer, and helpers to ask them through the openai SDK and read streamed answers."""

from __future__ import annotations

from typing import Any

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
