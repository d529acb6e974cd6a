"""The prefix-cache scenario: TTFT with a 1,000-token system prompt, cold and warm.

Each sample is a pair of requests, one at a time: cold, with a system prompt no server has seen
(random words, a new seed per sample), then warm, with the same system prompt and another
question. Conduit's prefix cache and llama-server's per-slot prompt cache (`cache_prompt`, on by
default) can serve the warm request's system prompt from memory; the cold one cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from benchmarks.prompts import PROMPTS, long_system_prompt
from benchmarks.stats import RequestResult

# Enough for a first text chunk; TTFT is what the scenario measures.
MAX_TOKENS = 4
# Seeds of the system prompts start here, away from anything else that seeds `long_system_prompt`.
FIRST_SEED = 1_000_000


class ChatTarget(Protocol):
    name: str

    async def send(self, prompt: str, max_tokens: int | None = None, system: str = ...) -> RequestResult: ...


@dataclass
class PrefixStats:
    target: str
    prompt_tokens: int  # of the cold requests (the server's count), max
    cold_ttft_ms: list[float] = field(default_factory=list)
    warm_ttft_ms: list[float] = field(default_factory=list)
    # What the server said it took from its cache on each warm request (None: it did not say).
    warm_cached_tokens: list[int | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _ttft_ms(result: RequestResult) -> float | None:
    return result.text_times[0] * 1000 if result.ok and result.text_times else None


async def measure(target: ChatTarget, samples: int, run_seed: int) -> PrefixStats:
    """`samples` cold/warm pairs; `run_seed` makes this run's system prompts differ from any
    earlier run's against the same (long-lived) server."""
    stats = PrefixStats(target.name, 0)
    for i in range(samples):
        system = long_system_prompt(FIRST_SEED + run_seed * 1000 + i)
        cold = await target.send(PROMPTS[(2 * i) % len(PROMPTS)], MAX_TOKENS, system=system)
        warm = await target.send(PROMPTS[(2 * i + 1) % len(PROMPTS)], MAX_TOKENS, system=system)
        cold_ms, warm_ms = _ttft_ms(cold), _ttft_ms(warm)
        if cold_ms is None or warm_ms is None:
            stats.errors.append(cold.error or warm.error or "no text in the answer")
            continue
        stats.prompt_tokens = max(stats.prompt_tokens, cold.prompt_tokens)
        stats.cold_ttft_ms.append(cold_ms)
        stats.warm_ttft_ms.append(warm_ms)
        stats.warm_cached_tokens.append(warm.cached_tokens)
    return stats
