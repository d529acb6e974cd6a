"""Typed results of `complete()`: the stream of GenerateResponse folded per choice.

`CompletionBuilder` is the one fold of that stream: the sync and async clients use it, and so
does the HTTP shim for whole (non-streamed) answers and usage counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import finish_reason_name


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    # "stop", "length" or "tool_calls"; None until the choice's Final arrives.
    finish_reason: str | None = None
    matched_stop: str = ""
    # Final.tool_calls; before it (or when it has none) the calls assembled from streamed pieces.
    tool_calls: list[ToolCall] = field(default_factory=list)
    completion_tokens: int = 0
    # A reasoning model's thinking (Chunk.reasoning_text), apart from `text`, and its token count.
    reasoning: str = ""
    reasoning_tokens: int = 0


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, those served from the engine's prefix cache
    reasoning_tokens: int = 0  # of completion_tokens, a reasoning model's thinking

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Completion:
    request_id: str
    prompt: pb.PromptInfo
    choices: list[Choice]

    @property
    def text(self) -> str:
        """The first choice's text, for the common n=1 case."""
        return self.choices[0].text

    @property
    def usage(self) -> Usage:
        return Usage(self.prompt.prompt_tokens, sum(c.completion_tokens for c in self.choices),
                     self.prompt.cached_tokens)


class CompletionBuilder:
    """Accumulates the responses of one Generate call in arrival order."""

    def __init__(self) -> None:
        self.request_id = ""
        self.prompt = pb.PromptInfo()
        self.choices: dict[int, Choice] = {}

    def add(self, response: pb.GenerateResponse) -> None:
        self.request_id = response.request_id or self.request_id
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self.prompt = response.prompt
        elif kind == "chunk":
            chunk = response.chunk
            choice = self._choice(chunk.index)
            choice.text += chunk.text
            choice.reasoning += chunk.reasoning_text
            choice.token_ids.extend(chunk.token_ids)
            choice.logprobs.extend(chunk.logprobs)
            for delta in chunk.tool_calls:
                _add_tool_call_delta(choice.tool_calls, delta)
            choice.completion_tokens = chunk.completion_tokens
        elif kind == "final":
            final = response.final
            choice = self._choice(final.index)
            choice.finish_reason = finish_reason_name(final.finish_reason)
            choice.matched_stop = final.matched_stop
            choice.completion_tokens = final.completion_tokens
            choice.reasoning_tokens = final.reasoning_tokens
            if final.tool_calls:  # whole calls: these win over the streamed pieces
                choice.tool_calls = [ToolCall(c.id, c.name, c.arguments) for c in final.tool_calls]

    def build(self) -> Completion:
        return Completion(self.request_id, self.prompt,
                          [self.choices[i] for i in sorted(self.choices)])

    def _choice(self, index: int) -> Choice:
        return self.choices.setdefault(index, Choice(index))


def _add_tool_call_delta(calls: list[ToolCall], delta: pb.ToolCallDelta) -> None:
    """The first piece of a call brings its id and name; later pieces extend its arguments."""
    while len(calls) <= delta.index:
        calls.append(ToolCall("", "", ""))
    call = calls[delta.index]
    call.id = call.id or delta.id
    call.name = call.name or delta.name
    call.arguments += delta.arguments
