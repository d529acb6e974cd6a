"""Typed results of `complete()`: the stream of GenerateResponse folded per choice."""

from __future__ import annotations

from dataclasses import dataclass, field

from conduit.v1 import engine_pb2 as pb

FINISH_REASONS = {
    pb.FINISH_REASON_UNSPECIFIED: None,
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


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
    tool_calls: list[ToolCall] = field(default_factory=list)
    completion_tokens: int = 0


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int

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
        return Usage(self.prompt.prompt_tokens, sum(c.completion_tokens for c in self.choices))


class CompletionBuilder:
    """Accumulates responses in arrival order; shared by the sync and async clients."""

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
            choice.token_ids.extend(chunk.token_ids)
            choice.logprobs.extend(chunk.logprobs)
            choice.completion_tokens = chunk.completion_tokens
        elif kind == "final":
            final = response.final
            choice = self._choice(final.index)
            choice.finish_reason = FINISH_REASONS[final.finish_reason]
            choice.matched_stop = final.matched_stop
            choice.completion_tokens = final.completion_tokens
            choice.tool_calls = [ToolCall(c.id, c.name, c.arguments) for c in final.tool_calls]

    def build(self) -> Completion:
        return Completion(self.request_id, self.prompt,
                          [self.choices[i] for i in sorted(self.choices)])

    def _choice(self, index: int) -> Choice:
        return self.choices.setdefault(index, Choice(index))
