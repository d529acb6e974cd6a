"""The engine's answer folded once for every API: as neutral events while it streams, or whole.

`StreamFold` turns each engine response (prompt info, chunks, finals of interleaved choices and
prompts) into events that say what happened, and owns what every API's stream must do alike: a tool
call's id (the engine's, or a new one) and whether it started, the rule that calls the engine did not
stream piecewise are sent whole before their choice ends, the finish reason and the usage. The stream
writers (openai/response.py, responses/events.py, messages/events.py) only format these events, and
the Responses and Messages writers' final objects are those APIs' whole answers too (OpenAI's whole
answer, whose best_of ranks complete choices, is openai/response.py's `Collector`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from conduit_common.results import Usage
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import finish_reason_name, new_tool_call_id


class Finish(StrEnum):
    """Why a choice ended (each API names it in a table of its own); a choice given no reason stopped."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"

    @classmethod
    def of(cls, value: int) -> Finish:
        """From the proto's FinishReason."""
        return cls(finish_reason_name(value) or cls.STOP)


class Event:
    """What happened in the answer, in no API's words."""


@dataclass(frozen=True)
class PromptRead(Event):  # its token counts; its text and logprobs when asked for
    prompt_index: int
    prompt: pb.PromptInfo


@dataclass(frozen=True)
class ChoiceEvent(Event):
    prompt_index: int
    choice: int


@dataclass(frozen=True)
class ReasoningDelta(ChoiceEvent):
    text: str


@dataclass(frozen=True)
class TextDelta(ChoiceEvent):  # `text` may be empty when the piece carries only logprobs
    text: str
    logprobs: list[pb.TokenLogprob]


@dataclass(frozen=True)
class ToolCallStart(ChoiceEvent):
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments(ChoiceEvent):  # every piece the engine sent, also an empty one
    index: int
    arguments: str


@dataclass(frozen=True)
class ChoiceEnd(ChoiceEvent):
    reason: Finish
    matched_stop: str


class StreamFold:
    def __init__(self) -> None:
        self._calls: dict[tuple[int, int], set[int]] = {}  # the calls started, per (prompt, choice)
        # Usage without keeping the text: prompt (and cached) tokens once per prompt, whatever n; the
        # latest completion-token count of every choice.
        self._prompts: dict[int, pb.PromptInfo] = {}
        self._completion_tokens: dict[tuple[int, int], int] = {}
        self._reasoning_tokens: dict[tuple[int, int], int] = {}

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[Event]:
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self._prompts[prompt_index] = response.prompt
            return [PromptRead(prompt_index, response.prompt)]
        if kind == "chunk":
            self._completion_tokens[prompt_index, response.chunk.index] = response.chunk.completion_tokens
            return self._chunk(prompt_index, response.chunk)
        if kind == "final":
            final = response.final
            self._completion_tokens[prompt_index, final.index] = final.completion_tokens
            self._reasoning_tokens[prompt_index, final.index] = final.reasoning_tokens
            return self._final(prompt_index, final)
        return []

    def usage(self) -> Usage:
        """What was generated so far: the whole answer's usage once it is complete."""
        prompts = self._prompts.values()
        return Usage(sum(p.prompt_tokens for p in prompts), sum(self._completion_tokens.values()),
                     sum(p.cached_tokens for p in prompts), sum(self._reasoning_tokens.values()))

    def _chunk(self, p: int, chunk: pb.Chunk) -> list[Event]:
        out: list[Event] = []
        if chunk.reasoning_text:
            out.append(ReasoningDelta(p, chunk.index, chunk.reasoning_text))
        if chunk.text or chunk.logprobs:
            out.append(TextDelta(p, chunk.index, chunk.text, list(chunk.logprobs)))
        for d in chunk.tool_calls:
            out += self._call(p, chunk.index, d.index, d.id, d.name, d.arguments)
        return out

    def _final(self, p: int, final: pb.Final) -> list[Event]:
        out: list[Event] = []
        started = self._calls.get((p, final.index), set())
        for k, call in enumerate(final.tool_calls):
            if k not in started:  # not streamed piecewise: sent whole
                out += self._call(p, final.index, k, call.id, call.name, call.arguments)
        return out + [ChoiceEnd(p, final.index, Finish.of(final.finish_reason), final.matched_stop)]

    def _call(self, p: int, choice: int, index: int, call_id: str, name: str, arguments: str) -> list[Event]:
        started = self._calls.setdefault((p, choice), set())
        out: list[Event] = []
        if index not in started:
            started.add(index)
            out.append(ToolCallStart(p, choice, index, call_id or new_tool_call_id(), name))
        return out + [ToolCallArguments(p, choice, index, arguments)]
