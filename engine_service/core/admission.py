"""Where a request enters the engine: the checks that need the engine's limits (context length,
KV capacity, vocabulary, batch size), and the max_tokens a request gets when it sets none."""

from __future__ import annotations

from dataclasses import dataclass

from engine_service.core.params import InvalidRequest
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
        if wanted is not None and prompt_len + wanted > limit:
            raise InvalidRequest(
                f"this model's maximum context length is {limit} tokens, but {prompt_len + wanted} were requested "
                f"({prompt_len} in the prompt, {wanted} for the completion); lower max_tokens",
                "stopping.max_tokens", "context_length_exceeded")
        request.max_tokens = limit - prompt_len if wanted is None else wanted
