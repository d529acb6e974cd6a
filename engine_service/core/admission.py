"""Where a request enters the engine: the checks that need the engine's limits (context length,
KV capacity, vocabulary, batch size), and the max_tokens a request gets.

The budget policy (every API alike, as llama.cpp's server does): a prompt that leaves no room for one
generated token is refused (`context_length_exceeded`); a max_tokens larger than the room the context
leaves is capped to that room, not refused. Agents send the largest budget they know (Claude Code
32000, whatever the model), so refusing it would fail every request; the cap shows in the engine's
`generate:` log line and as finish reason LENGTH when the output reaches it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine_service.core.params import InvalidRequest

if TYPE_CHECKING:  # sequence.py imports torch; the HTTP shim's fake engine checks prompts here without it
    from engine_service.core.sequence import Request


@dataclass(frozen=True)
class Admission:
    max_model_len: int
    kv_capacity_tokens: int
    vocab_size: int
    max_batch_size: int

    @property
    def context_limit(self) -> int:
        """Tokens a sequence may hold: the model's context, or the whole KV cache if smaller."""
        return min(self.max_model_len, self.kv_capacity_tokens)

    def check(self, request: Request) -> None:
        """Raise InvalidRequest naming the field at fault, or set `request.max_tokens`."""
        if request.inputs is not None:
            self._check_inputs(request.inputs)
            request.max_tokens = 0
            return
        prompt_len = len(request.prompt_ids)
        if prompt_len == 0:
            raise InvalidRequest("the prompt is empty", "input")
        limit = self.context_limit
        if prompt_len >= limit:
            raise InvalidRequest(
                f"this model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens "
                f"(the prompt plus at least one generated token must fit)", "input", "context_length_exceeded")
        if any(t >= self.vocab_size for t in request.prompt_ids):
            raise InvalidRequest(f"prompt token ids must be below the vocabulary size {self.vocab_size}", "input")
        request.params.validate(self.vocab_size)
        if request.params.n > self.max_batch_size:
            raise InvalidRequest(f"n={request.params.n} exceeds this engine's batch size {self.max_batch_size}", "n")
        wanted = request.params.stopping.max_tokens
        room = limit - prompt_len
        request.max_tokens = room if wanted is None else min(wanted, room)

    def _check_inputs(self, inputs: list[list[int]]) -> None:
        """An Embed's inputs (serving/embed.py checked them against the context already, naming each):
        a prompt to the last token, no generated token after it."""
        if not inputs:
            raise InvalidRequest("inputs must not be empty", "inputs")
        for i, ids in enumerate(inputs):
            if not ids or len(ids) > self.context_limit or any(not 0 <= t < self.vocab_size for t in ids):
                raise InvalidRequest(f"inputs[{i}] must have 1 to {self.context_limit} token ids below the "
                                     f"vocabulary size {self.vocab_size}", f"inputs[{i}]")
