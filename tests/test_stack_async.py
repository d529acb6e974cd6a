"""The async openai SDK against the real stack: streaming, non-streaming and concurrent requests."""

from __future__ import annotations

import asyncio

import openai
import pytest

from common import MODEL, PROMPT, QUESTION, ask_async

pytestmark = pytest.mark.model


def test_async_streamed_equals_non_streamed(async_openai_client: openai.AsyncOpenAI,
                                            loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> tuple[str, str]:
        whole = await ask_async(async_openai_client)
        streamed = ""
        async for chunk in await ask_async(async_openai_client, stream=True):
            streamed += "".join(choice.delta.content or "" for choice in chunk.choices)
        return whole.choices[0].message.content, streamed

    whole, streamed = loop.run_until_complete(scenario())
    assert "Paris" in whole
    assert streamed == whole


def test_async_concurrent_requests(async_openai_client: openai.AsyncOpenAI,
                                   loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> list[str]:
        async def streamed() -> str:
            text = ""
            async for chunk in await ask_async(async_openai_client, stream=True):
                text += "".join(choice.delta.content or "" for choice in chunk.choices)
            return text

        async def whole() -> str:
            return (await ask_async(async_openai_client)).choices[0].message.content

        return await asyncio.gather(streamed(), whole(), streamed(), whole())

    answers = loop.run_until_complete(scenario())
    assert all("Paris" in answer for answer in answers), answers


def test_async_completions(async_openai_client: openai.AsyncOpenAI, loop: asyncio.AbstractEventLoop) -> None:
    async def scenario():
        return await async_openai_client.completions.create(model=MODEL, prompt=PROMPT,
                                                            temperature=0, max_tokens=5)

    response = loop.run_until_complete(scenario())
    assert response.choices[0].text
    assert response.usage.completion_tokens == 5


def test_async_unknown_model_is_404(async_openai_client: openai.AsyncOpenAI,
                                    loop: asyncio.AbstractEventLoop) -> None:
    with pytest.raises(openai.NotFoundError):
        loop.run_until_complete(async_openai_client.chat.completions.create(model="no-such-model",
                                                                            messages=QUESTION))
