"""The order of prose and tagged calls in an output's chunks (issue 52), on the default model's
tokenizer: a chunk's text comes before its calls, so text written after a call goes out in a later
chunk, even when the engine sends a sequence's tokens of several steps at once (--stream-interval)."""

from __future__ import annotations

import json

import pytest

from conduit.v1 import engine_pb2 as pb
from engine_service.core.events import TokenLogprob
from engine_service.model.loader import DEFAULT_MODEL_ID, resolve_model
from engine_service.text.output import OutputProcessor
from engine_service.text.tools import ToolSpec

pytestmark = pytest.mark.model  # the real tokenizer (seconds, the first time)

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def processor() -> tuple[OutputProcessor, object]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL_ID)[1])
    spec = ToolSpec.from_chat(pb.ChatInput(tools=[pb.Tool(name="get_weather")],
                                           tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_AUTO)))
    output = OutputProcessor(index=0, prompt_ids=[], tokenizer=tokenizer, stop_ids={tokenizer.eos_token_id},
                             eos_ids=[tokenizer.eos_token_id], stop_strings=[], min_tokens=0, max_tokens=100,
                             tools=spec, matcher=None)
    return output, tokenizer


def test_text_after_a_call_goes_out_in_a_later_chunk_with_its_own_tokens() -> None:
    output, tokenizer = processor()
    ids = tokenizer.encode(f"I'll look.\n{CALL}\nDone soon.", add_special_tokens=False) + [tokenizer.eos_token_id]
    for k, token in enumerate(ids):
        output.add(token, TokenLogprob(token, -float(k), []))
    before, after = output.chunks()  # all of them at once, as a stream interval groups them
    assert (before.text, [(d.name, d.arguments) for d in before.tool_calls]) == (
        "I'll look.", [("get_weather", ""), ("", '{"city": "Paris"}')])
    assert (after.text, after.tool_calls) == ("\nDone soon.", [])
    assert before.token_ids + after.token_ids == ids
    assert [lp.token_id for lp in before.logprobs + after.logprobs] == ids
    assert (before.completion_tokens, after.completion_tokens) == (len(before.token_ids), len(ids))
    # The later chunk's tokens start at the one that let its text go (the newline was held until then).
    assert tokenizer.decode(after.token_ids).startswith("Done")
    assert [(c.name, json.loads(c.arguments)) for c in output.tool_calls] == [("get_weather", {"city": "Paris"})]
