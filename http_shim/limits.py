"""The operator's caps on one request, which every API's parser enforces (flags --max-tokens-limit,
--max-n, ...; http_shim/options.py), and the shim's own fixed limits."""

from __future__ import annotations

from dataclasses import dataclass

from conduit.v1.contract import MAX_N, MAX_STOP_STRINGS


UINT32_MAX = 2**32 - 1  # token ids and counts are uint32 in the contract
# The engine's limits (conduit.v1.contract) bound n, best_of, stop, top_logprobs and the sampling
# fields; these are the shim's own.
MAX_PROMPTS = 64  # prompts in one /v1/completions request; each becomes one Generate call
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for the legacy completions `logprobs`


@dataclass(frozen=True)
class RequestLimits:
    """Each cap is refused as a 400 naming the parameter; n and stop cannot exceed the engine's limits."""

    # max_tokens / max_completion_tokens, and the default when a request sets neither;
    # None: what the context leaves.
    max_tokens: int | None = None
    max_n: int = MAX_N  # n, and best_of for /v1/completions
    max_stop: int = MAX_STOP_STRINGS  # stop strings
    max_messages: int = 2048  # chat messages
    max_prompt_chars: int = 1_000_000  # characters of prompt text (see prompt_chars)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and not 1 <= self.max_tokens <= UINT32_MAX:
            raise ValueError(f"max_tokens limit must be between 1 and {UINT32_MAX}")
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be between 1 and {MAX_N} (the engine's limit)")
        if not 0 <= self.max_stop <= MAX_STOP_STRINGS:
            raise ValueError(f"max_stop must be between 0 and {MAX_STOP_STRINGS} (the engine's limit)")
        if self.max_messages < 1 or self.max_prompt_chars < 1:
            raise ValueError("max_messages and max_prompt_chars must be positive")


DEFAULT_LIMITS = RequestLimits()
