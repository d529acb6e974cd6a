"""The engine's answer folded once for every API: as neutral events while it streams, or whole.

`StreamFold` turns each engine response (prompt info, chunks, finals of interleaved choices and
prompts) into events that say what happened, and owns what every API's stream must do alike: a tool
call's id (the engine's, or a new one) and whether it started, the rule that calls the engine did not
stream piecewise are sent whole before their choice ends, the finish reason and the usage. The stream
writers (openai/response.py, responses/events.py, messages/events.py) only format these events, and
the Responses and Messages writers' final objects are those APIs' whole answers too. `Collector` keeps
OpenAI's whole answer, whose best_of ranks complete choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from conduit_common.results import Choice, Completion, CompletionBuilder, Usage
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import finish_reason_name, new_tool_call_id


class Finish(StrEnum):
    """Why a choice ended (each API names it in a table of its own); a choice given no reason stopped."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"

    @classmethod
    def named(cls, name: str | None) -> Finish:
        """From the client library's name (a whole answer's `Choice.finish_reason`)."""
        return cls(name or cls.STOP)

    @classmethod
    def of(cls, value: int) -> Finish:
        """From the proto's FinishReason."""
        return cls.named(finish_reason_name(value))


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


class Collector:
    """The responses of every Generate call of one HTTP request, folded per prompt."""

    def __init__(self) -> None:
        self._prompts: dict[int, CompletionBuilder] = {}

    def add(self, prompt_index: int, response: pb.GenerateResponse) -> None:
        self._prompts.setdefault(prompt_index, CompletionBuilder()).add(response)

    def completion(self, prompt_index: int) -> Completion:
        completion = self._prompts.get(prompt_index, CompletionBuilder()).build()
        for call in (call for choice in completion.choices for call in choice.tool_calls):
            call.id = call.id or new_tool_call_id()  # as a stream's ToolCallStart has (the builder keeps it)
        return completion

    def usage(self) -> Usage:
        """Prompt (and cached) tokens once per prompt, whatever n; every choice's completion tokens."""
        prompts = [builder.prompt for builder in self._prompts.values()]
        choices = [choice for builder in self._prompts.values() for choice in builder.choices.values()]
        return Usage(sum(p.prompt_tokens for p in prompts), sum(c.completion_tokens for c in choices),
                     sum(p.cached_tokens for p in prompts), sum(c.reasoning_tokens for c in choices))

    def ranked(self, prompt_index: int, n: int, best_of: int) -> list[Choice]:
        """The choices to return for one prompt: all of them, or the best n of best_of."""
        by_index = {c.index: c for c in self.completion(prompt_index).choices}
        choices = [by_index.get(i, Choice(i)) for i in range(best_of)]
        if best_of > n:
            choices = sorted(choices, key=cumulative_logprob, reverse=True)[:n]
        return choices


def cumulative_logprob(choice: Choice) -> float:
    return sum(e.logprob for e in choice.logprobs if not math.isnan(e.logprob))
