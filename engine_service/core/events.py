"""What the engine tells a request's sink: the prompt once, chunks of new output, a final per choice."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conduit_common.results import ToolCall
from engine_service.text.tools import ToolCallDelta

if TYPE_CHECKING:
    import torch


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    # The three below end a request without a normal Final: the servicer ends the call with a status.
    CANCELLED = "cancelled"  # the caller went away (cancellation, deadline): CANCELLED
    ERROR = "error"  # an engine step failed on this request: INTERNAL
    SHUTDOWN = "shutdown"  # the engine stopped (drain deadline passed) before it finished: UNAVAILABLE

    @property
    def abnormal(self) -> bool:
        return self in (FinishReason.CANCELLED, FinishReason.ERROR, FinishReason.SHUTDOWN)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class PromptEvent:
    prompt_ids: list[int]
    prompt_logprobs: list[TokenLogprob | None] | None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass
class ChunkEvent:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    reasoning: str = ""  # a reasoning model's new thinking (kept out of `text`)


@dataclass
class FinalEvent:
    index: int
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    matched_stop: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_tokens: int = 0  # of completion_tokens, the thinking's
    embedding: torch.Tensor | None = None  # an Embed's input (index): its normalized float32 vector


Event = PromptEvent | ChunkEvent | FinalEvent
