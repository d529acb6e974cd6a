"""n-gram (prompt-lookup) speculative decoding: drafts from a sequence's own tokens, checked in the
step that decodes it (vLLM's `--speculative-config '{"method": "ngram", ...}'`).

A draft is the tokens that followed the latest earlier occurrence of the sequence's last n tokens
(n from prompt_lookup_max down to prompt_lookup_min): output that quotes its prompt (code edits, a
passage repeated, JSON echoing its input) is found there. The sequence's last token and its k draft
tokens are k + 1 decode rows of one step (model/runner.py), each over its own context and computed
by the kernels of any decode row, so each row's logits are the bits decoding token by token would
give. The engine core then samples position by position as without drafts (the same sampler,
penalties, grammar, seed) and goes on while the token it sampled is the draft's (llama.cpp's rule):
the output is the one decoding without drafts gives, greedy token for token and sampled in
distribution (a seeded request: the same tokens). The keys and values of rejected drafts stay in the
cache past the sequence's computed length, overwritten by its next tokens, never shared.

A draft token costs a row of the step whether it is accepted or not, and every sequence in the step
waits for it; so each sequence drafts the k that maximizes its expected tokens per unit of step
time, from its own running acceptance rate and the number of sequences decoding (`draft_length`).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_service.core.block_manager import BlockManager
    from engine_service.core.scheduler import ScheduledBatch

METHODS = ("ngram",)
MAX_SPECULATIVE_TOKENS = 16
# A draft row's cost relative to a one-row step. CPU: a batch-1 step of the default model takes ~9 ms
# on the int8 kernel and each further row ~2.3 ms (benchmarks/RESULTS.md, "Speculative decoding").
DRAFT_ROW_COST = {"cpu": 0.25, "cuda": 0.03}
ACCEPTANCE_PRIOR = 0.5  # a new sequence's, and the level its estimate drifts back to while not drafting
ACCEPTANCE_WEIGHT = 0.2  # of each verified draft token in the running estimate
ACCEPTANCE_DRIFT = 0.02  # per step without a draft: a sequence whose drafts failed tries again now and then


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4  # k, the most draft tokens a step checks for a sequence
    prompt_lookup_max: int = 4  # the longest n-gram looked up
    prompt_lookup_min: int = 2  # the shortest

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be from 1 to {MAX_SPECULATIVE_TOKENS}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max")

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig:
        """vLLM's JSON form; ValueError naming what is wrong (an unknown key, a bad value)."""
        try:
            given = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not JSON: {exc}") from None
        if not isinstance(given, dict):
            raise ValueError("speculative_config must be a JSON object")
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}")
        for name, value in given.items():
            wanted = str if name == "method" else int
            if type(value) is not wanted:
                raise ValueError(f"speculative_config.{name} must be {'a string' if wanted is str else 'an integer'}")
        if "prompt_lookup_max" in given and "prompt_lookup_min" not in given:
            given["prompt_lookup_min"] = min(cls.prompt_lookup_min, given["prompt_lookup_max"])
        return cls(**given)


def propose(tokens: list[int], config: SpeculativeConfig, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of tokens' last n (the longest n
    that occurs); [] when none does."""
    if k <= 0:
        return []
    packed = array("I", tokens).tobytes()
    for n in range(min(config.prompt_lookup_max, len(tokens) - 1), config.prompt_lookup_min - 1, -1):
        pattern = packed[-4 * n:]
        end = len(packed) - 4  # an occurrence must end before the last token: the suffix itself is no match
        while (found := packed.rfind(pattern, 0, end)) >= 0:
            if found % 4 == 0:  # on a token's boundary
                start = found // 4 + n
                return tokens[start:start + k]
            end = found + 4 * n - 1
    return []


def draft_length(acceptance: float, decoding: int, row_cost: float, most: int) -> int:
    """The k in 0..most that maximizes the step's expected tokens per unit of its time, for one of
    `decoding` sequences with acceptance rate a: (decoding + a + a^2 + ... + a^k) tokens over
    1 + row_cost * (decoding - 1 + k) (each row past the first costs row_cost of a one-row step)."""
    base = 1 + row_cost * (decoding - 1)
    best, best_rate, expected = 0, decoding / base, float(decoding)
    for k in range(1, most + 1):
        expected += acceptance ** k
        rate = expected / (base + row_cost * k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


class Acceptance:
    """A sequence's running rate of accepted draft tokens."""

    __slots__ = ("rate",)

    def __init__(self) -> None:
        self.rate = ACCEPTANCE_PRIOR

    def verified(self, accepted: int, refused: bool) -> None:
        """A draft whose first `accepted` tokens were taken, and then one `refused` (or the draft ran
        out, or the sequence ended); tokens after a refusal were never checked and do not count."""
        for _ in range(accepted):
            self.rate += ACCEPTANCE_WEIGHT * (1 - self.rate)
        if refused:
            self.rate -= ACCEPTANCE_WEIGHT * self.rate

    def idle(self) -> None:
        self.rate += ACCEPTANCE_DRIFT * (ACCEPTANCE_PRIOR - self.rate)


class Speculator:
    """Gives a step's decoding sequences their drafts (ScheduledBatch.drafts), within `max_rows`
    decode rows in all: past them the int8 weights' decode rows would run a bf16 copy, which rounds
    otherwise than the rows decoded without drafts (model/linear.py), and gains vanish anyway."""

    def __init__(self, config: SpeculativeConfig, blocks: BlockManager, row_cost: float, max_rows: int) -> None:
        self.config = config
        self.blocks = blocks
        self.row_cost = row_cost
        self.max_rows = max_rows

    def draft(self, batch: ScheduledBatch) -> None:
        decoding = len(batch.decode)
        room = self.max_rows - decoding
        for seq in batch.decode:
            most = min(self.config.num_speculative_tokens, room, seq.request.max_tokens - seq.num_output - 1)
            k = draft_length(seq.acceptance.rate, decoding, self.row_cost, most) if most > 0 else 0
            drafts = propose(seq.token_ids, self.config, k)
            if not drafts or not self.blocks.reserve(seq, seq.num_cached + 1 + len(drafts)):
                seq.acceptance.idle()
                continue
            batch.drafts[seq.seq_id] = drafts
            room -= len(drafts)
