"""GenerateRequest.drop_oldest_messages (engine_service/text/truncation.py) on a word-counting
tokenizer: which messages go together, the fewest turns dropped, counted on the rendered prompt in
a few renders, and the refusal when the last turn alone does not fit. The real stack's test is
tests/test_responses_stack.py (truncation)."""

from __future__ import annotations

import math

import pytest

from conduit.v1 import engine_pb2 as pb
from engine_service.core.params import InvalidRequest
from engine_service.text.truncation import fit_chat, turns


class WordTokenizer:
    """A token a word; a chat renders as `role: content` per message. Counts its tokenizations."""

    chat_template = "role: content"  # names no tools: the tool prompt goes in the system message

    def __init__(self) -> None:
        self.calls = 0

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs) -> str:
        return " ".join(f"{m['role']}: {m['content']}" for m in messages) + " assistant:"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        self.calls += 1
        return {"input_ids": [0] * len(text.split())}


def message(role: str, words: int = 1, **fields) -> pb.ChatMessage:
    return pb.ChatMessage(role=role, content=" ".join(["w"] * words), **fields)


CALL = pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def conversation(turns_before: int) -> list[pb.ChatMessage]:
    """A system message, `turns_before` user/assistant turns of 10 words, a call with its two
    results, and a last question."""
    messages = [message("system", 5)]
    for i in range(turns_before):
        messages.append(message("user" if i % 2 == 0 else "assistant", 10))
    messages += [message("assistant", 2, tool_calls=[CALL]), message("tool", 3, tool_call_id="call_1"),
                 message("tool", 3, tool_call_id="call_1"), message("user", 4)]
    return messages


def test_a_call_goes_with_its_results_and_system_messages_with_none() -> None:
    messages = [message("system"), message("user"), message("assistant", tool_calls=[CALL]), message("tool"),
                message("tool"), message("user"), message("developer"), message("user")]
    assert turns(messages) == [[1], [2, 3, 4], [5], [7]]


def test_the_fewest_turns_go_counted_on_the_rendered_prompt_in_few_renders() -> None:
    tokenizer = WordTokenizer()
    messages = conversation(turns_before=40)
    request = pb.GenerateRequest(chat=pb.ChatInput(messages=messages))
    whole = len(fit_chat(tokenizer, request, budget=10_000)[0])
    assert tokenizer.calls == 1  # it fits: one render, as without truncation
    # Each old turn renders as 11 tokens ("user:" and 10 words): room for the 25 newest of the 40.
    budget = whole - 15 * 11
    tokenizer.calls = 0
    ids, dropped = fit_chat(tokenizer, request, budget)
    assert dropped == 15 and len(ids) == budget
    assert tokenizer.calls <= 2 + math.ceil(math.log2(42))  # the whole, the least, then bisection
    ids, dropped = fit_chat(tokenizer, request, budget - 1)  # one token less: one turn more
    assert dropped == 16 and len(ids) == budget - 11


def test_the_last_turn_and_the_system_messages_stay_or_it_is_refused() -> None:
    tokenizer = WordTokenizer()
    request = pb.GenerateRequest(chat=pb.ChatInput(messages=conversation(turns_before=3)))
    last_only = len(fit_chat(tokenizer, pb.GenerateRequest(chat=pb.ChatInput(
        messages=[message("system", 5), message("user", 4)])), budget=10_000)[0])
    # The call and its two results are one turn: with the three turns before it, 6 messages go.
    ids, dropped = fit_chat(tokenizer, request, last_only)
    assert dropped == 6 and len(ids) == last_only
    with pytest.raises(InvalidRequest) as refused:
        fit_chat(tokenizer, request, last_only - 1)
    assert refused.value.param == "input" and refused.value.code == "context_length_exceeded"
