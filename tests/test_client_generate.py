"""The Python gRPC client (sync and asyncio) against the real engine: streaming, complete(), cancellation."""

from __future__ import annotations

import asyncio

import pytest

from clients import AsyncEngineClient, DeadlineExceeded, EngineClient
from launcher.stack import Stack
from common import QUESTION, STORY
from conduit.v1 import engine_pb2 as pb

pytestmark = pytest.mark.model


def test_complete_answers(engine_client: EngineClient) -> None:
    result = engine_client.complete(messages=QUESTION, temperature=0, max_tokens=30)
    assert "Paris" in result.text
    assert result.request_id
    choice = result.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert result.usage.prompt_tokens == len(engine_client.tokenize(messages=QUESTION).token_ids)
    assert result.usage.completion_tokens == len(choice.token_ids) == choice.completion_tokens
    assert engine_client.detokenize(choice.token_ids).startswith(choice.text.rstrip())


def test_stream_order_and_counts(engine_client: EngineClient) -> None:
    request_id = "test-stream-order"
    responses = list(engine_client.generate(messages=QUESTION, temperature=0, max_tokens=5, n=2,
                                            request_id=request_id))
    kinds = [response.WhichOneof("kind") for response in responses]
    assert kinds[0] == "prompt" and "prompt" not in kinds[1:]
    assert kinds[-1] == "final"
    assert all(response.request_id == request_id for response in responses)
    prompt_tokens = responses[0].prompt.prompt_tokens
    for index in (0, 1):
        chunks = [r.chunk for r in responses if r.WhichOneof("kind") == "chunk" and r.chunk.index == index]
        final = next(r.final for r in responses if r.WhichOneof("kind") == "final" and r.final.index == index)
        # A choice's Final is its last message; other choices may still be streaming.
        choice_kinds = [r.WhichOneof("kind") for r in responses[1:]
                        if getattr(r, r.WhichOneof("kind")).index == index]
        assert choice_kinds == ["chunk"] * len(chunks) + ["final"]
        generated = 0
        for chunk in chunks:
            generated += len(chunk.token_ids)
            assert chunk.completion_tokens == generated  # cumulative
            assert chunk.prompt_tokens == prompt_tokens
        assert final.finish_reason == pb.FINISH_REASON_LENGTH
        assert final.completion_tokens == generated == 5
        assert final.prompt_tokens == prompt_tokens


def test_streamed_text_equals_complete(engine_client: EngineClient) -> None:
    whole = engine_client.complete(messages=QUESTION, temperature=0, max_tokens=20)
    streamed = "".join(r.chunk.text for r in engine_client.generate(messages=QUESTION, temperature=0,
                                                                      max_tokens=20)
                       if r.WhichOneof("kind") == "chunk")
    assert streamed == whole.text


def test_request_message_and_kwargs_agree(engine_client: EngineClient) -> None:
    question = pb.ChatMessage(role="user", content=QUESTION[0]["content"])
    request = pb.GenerateRequest(chat=pb.ChatInput(messages=[question]), sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=10))
    assert engine_client.complete(request).text == engine_client.complete(messages=QUESTION, temperature=0,
                                                                          max_tokens=10).text


def test_stop_string(engine_client: EngineClient) -> None:
    full = engine_client.complete(messages=QUESTION, temperature=0, max_tokens=30).text
    assert "Paris" in full
    stopped = engine_client.complete(messages=QUESTION, temperature=0, max_tokens=30, stop=["Paris"])
    choice = stopped.choices[0]
    assert (choice.text, choice.finish_reason, choice.matched_stop) == (full[: full.index("Paris")], "stop", "Paris")


def test_text_and_token_id_inputs_agree(engine_client: EngineClient) -> None:
    prompt = "The capital of France is"
    ids = list(engine_client.tokenize(prompt).token_ids)
    by_text = engine_client.complete(prompt=prompt, temperature=0, max_tokens=6)
    by_ids = engine_client.complete(token_ids=ids, temperature=0, max_tokens=6)
    assert by_text.text == by_ids.text
    assert by_text.usage.prompt_tokens == by_ids.usage.prompt_tokens == len(ids)


def test_seed_makes_sampling_repeatable(engine_client: EngineClient) -> None:
    params = {"messages": QUESTION, "temperature": 1.0, "max_tokens": 20, "seed": 1234}
    assert engine_client.complete(**params).text == engine_client.complete(**params).text


def test_deadline_exceeded(engine_client: EngineClient) -> None:
    with pytest.raises(DeadlineExceeded) as caught:
        engine_client.complete(messages=STORY, ignore_eos=True, max_tokens=4000, timeout=1.0)
    assert caught.value.code.name == "DEADLINE_EXCEEDED"
    assert "Paris" in engine_client.complete(messages=QUESTION, temperature=0, max_tokens=30).text


def endless(engine: EngineClient) -> dict:
    """A generation that would run to the end of the context: minutes of work for the engine."""
    info = engine.model_info()
    return {"messages": STORY, "ignore_eos": True,
            "max_tokens": info.max_context_length - len(engine.tokenize(messages=STORY).token_ids) - 1}


def test_closing_the_stream_frees_the_engine(single_slot_stack: Stack) -> None:
    # One sequence at a time: the follow-up only fits in its deadline if the abandoned call was stopped.
    with EngineClient(single_slot_stack.engine_address, timeout=60) as engine:
        stream = engine.generate(**endless(engine))
        assert next(stream).WhichOneof("kind") == "prompt"
        assert next(stream).WhichOneof("kind") == "chunk"
        stream.close()
        assert "Paris" in engine.complete(messages=QUESTION, temperature=0, max_tokens=30).text


def test_deadline_frees_the_engine(single_slot_stack: Stack) -> None:
    with EngineClient(single_slot_stack.engine_address, timeout=60) as engine:
        with pytest.raises(DeadlineExceeded):
            engine.complete(**endless(engine), timeout=2.0)
        assert "Paris" in engine.complete(messages=QUESTION, temperature=0, max_tokens=30).text


def test_async_client(async_engine_client: AsyncEngineClient, engine_client: EngineClient,
                      loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> tuple[str, str, str]:
        whole = await async_engine_client.complete(messages=QUESTION, temperature=0, max_tokens=20)
        streamed = ""
        async with async_engine_client.generate(messages=QUESTION, temperature=0, max_tokens=20) as stream:
            async for response in stream:
                streamed += response.chunk.text
        health = await async_engine_client.health()
        return whole.text, streamed, health

    whole, streamed, health = loop.run_until_complete(scenario())
    assert "Paris" in whole
    assert streamed == whole
    assert whole == engine_client.complete(messages=QUESTION, temperature=0, max_tokens=20).text
    assert health == "SERVING"


def test_async_concurrent_and_early_close(single_slot_stack: Stack, loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> list[str]:
        async with AsyncEngineClient(single_slot_stack.engine_address, timeout=60) as engine:
            info = await engine.model_info()
            prompt_tokens = len((await engine.tokenize(messages=STORY)).token_ids)
            async with engine.generate(messages=STORY, ignore_eos=True,
                                       max_tokens=info.max_context_length - prompt_tokens - 1) as stream:
                async for response in stream:
                    if response.WhichOneof("kind") == "chunk":
                        break  # leaving the block cancels the call
            # Two: they wait (the queue holds two) until the cancelled call leaves the one slot.
            results = await asyncio.gather(*(engine.complete(messages=QUESTION, temperature=0, max_tokens=30)
                                             for _ in range(2)))
            return [result.text for result in results]

    answers = loop.run_until_complete(scenario())
    assert all("Paris" in answer for answer in answers), answers
