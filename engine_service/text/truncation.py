"""GenerateRequest.drop_oldest_messages: a chat's oldest turns dropped until its prompt fits.

Counted on the prompt itself: each try renders and tokenizes the kept messages with the chat's
tools, tool choice and answer format, as Generate does, so what fits here fits there. The number
of turns to drop is found by bisection (dropping more never lengthens a prompt): about log2(turns)
renders, not one per dropped turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conduit.v1 import engine_pb2 as pb
from engine_service.core.params import InvalidRequest
from engine_service.text.prompts import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

KEPT_ROLES = ("system", "developer")


def turns(messages: list[pb.ChatMessage]) -> list[list[int]]:
    """The indices of the droppable messages, by turn in order: a message and the tool results
    after it (a call goes with its results). System and developer messages are in none."""
    out: list[list[int]] = []
    for i, message in enumerate(messages):
        if message.role in KEPT_ROLES:
            continue
        if message.role == "tool" and out:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def fit_chat(tokenizer: PreTrainedTokenizerBase, request: pb.GenerateRequest, budget: int) -> tuple[list[int], int]:
    """The prompt ids of the request's chat with its oldest turns dropped until at most `budget`
    tokens (never the system messages or the last turn), and how many messages were dropped.
    Raises InvalidRequest (context_length_exceeded) when even those do not fit."""
    chat, answer_format = request.chat, request.constraint
    ids = chat_ids(tokenizer, chat, answer_format)
    groups = turns(list(chat.messages))
    if len(ids) <= budget:
        return ids, 0
    tried: dict[int, list[int]] = {0: ids}

    def ids_without(first_turns: int) -> list[int]:
        if first_turns not in tried:
            dropped = {i for group in groups[:first_turns] for i in group}
            kept = pb.ChatInput()
            kept.CopyFrom(chat)
            del kept.messages[:]
            kept.messages.extend(m for i, m in enumerate(chat.messages) if i not in dropped)
            tried[first_turns] = chat_ids(tokenizer, kept, answer_format)
        return tried[first_turns]

    last = max(len(groups) - 1, 0)  # the most that may go: all but the last turn
    if len(ids_without(last)) > budget:
        raise InvalidRequest(
            f"the prompt does not fit this model's context even with its oldest turns dropped: the system messages "
            f"and the last turn take {len(ids_without(last))} tokens, and the context leaves {budget} beside the "
            f"completion's max_tokens", "input", "context_length_exceeded")
    low, high = 1, last  # dropping `high` turns fits; dropping fewer than `low` does not
    while low < high:
        middle = (low + high) // 2
        if len(ids_without(middle)) <= budget:
            high = middle
        else:
            low = middle + 1
    return ids_without(high), sum(len(group) for group in groups[:high])
