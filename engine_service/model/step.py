"""What one engine step hands the model runner, and what it gets back: plain data, no scheduler
objects, so the model package imports nothing from the engine core (core/scheduler.py builds a
StepInput from its ScheduledBatch). No torch at import: the types only name tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# A prompt is computed in segments of its positions, each with calls of its own (every linear, the
# attention): a segment's arithmetic then depends on its own tokens and the context before it, never on
# how the prompt was chunked, what was cached, or what else the step held. Dense CPU kernels may round a
# row by the number of rows in the call (oneDNN's AMX kernels block by it), so this is what makes a prompt
# compute alike cached or not, on every CPU (docs/engine.md, "Numerics"). The engine's segments are
# SEGMENT_TOKENS long from the first position: each segment streams every weight once, so shorter calls cost
# prefill time (16-row calls throughout: +60% here; 64: +7%), and a short prompt in block-long segments below
# 64 paid for each (a 27-token prompt 22.9 ms against 17.8 in one call, AMD EPYC: benchmarks/RESULTS.md),
# while a prefix-cache hit cut to 64 tokens loses at most 63 tokens of compute.
SEGMENT_TOKENS = 64


@dataclass(frozen=True)
class Segments:
    """Where a prompt's segments begin: every `block` positions below `length`, every `length` after
    (`length` a multiple of `block`). Prefix-cache hits end and prompt chunks are cut on these
    boundaries, so a prompt computes the same calls whether it was cached or not."""

    block: int
    length: int

    @classmethod
    def for_engine(cls, block_size: int, max_step_tokens: int = 512) -> Segments:
        """Segments of whole blocks, about SEGMENT_TOKENS, within a step's token budget, from the first position."""
        length = max(1, min(SEGMENT_TOKENS, max_step_tokens) // block_size) * block_size
        return cls(length, length)

    def floor(self, position: int) -> int:
        """The last boundary at or before `position`."""
        step = self.block if position < self.length else self.length
        return position // step * step

    def next(self, position: int) -> int:
        """The first boundary after `position`."""
        step = self.block if position < self.length else self.length
        return (position // step + 1) * step

    def split(self, first: int, length: int) -> list[tuple[int, int]]:
        """Positions first..first+length cut at the boundaries: (first position, length) each."""
        cuts, end = [first], first + length
        while (boundary := self.next(cuts[-1])) < end:
            cuts.append(boundary)
        cuts.append(end)
        return [(start, stop - start) for start, stop in zip(cuts, cuts[1:])]


@dataclass(slots=True)
class DecodeRow:
    """A decoding sequence's one token this step: its last, not yet cached."""

    seq_id: int
    token: int
    position: int
    block_table: list[int]  # the sequence's cache blocks (read during the step, not kept)
    # Draft tokens after `token` (core/speculation.py): a decode row each, at the positions after it.
    drafts: list[int] = field(default_factory=list)
    adapter: int = 0  # the LoRA adapter's slot (model/lora.py); 0: the base model


@dataclass(slots=True)
class PromptChunk:
    """Prompt tokens a sequence computes this step, from `first_position` on."""

    seq_id: int
    token_ids: list[int]
    first_position: int
    block_table: list[int]
    ends_prompt: bool  # its last token is the prompt's: its logits row picks the first output token
    keep_all_rows: bool = False  # every row's logits wanted (the prompt's logprobs)
    wants_hidden: bool = False  # an embedding: the final-normed hidden row of the prompt's last token
    adapter: int = 0  # the LoRA adapter's slot (model/lora.py); 0: the base model


@dataclass
class StepInput:
    decode: list[DecodeRow] = field(default_factory=list)
    prefill: list[PromptChunk] = field(default_factory=list)


class StepGaveWay(Exception):
    """The step stopped between two layers because its `give_way` said so (a batch step an interactive
    request arrived during: core/engine_core.py). It leaves nothing behind that counts: the keys and values
    it wrote sit past each sequence's cached length, so the step runs again later from the start."""


@dataclass
class StepLogits:
    """Logits rows the step produced, by purpose."""

    next_token: dict[int, torch.Tensor]  # seq_id -> [vocab] logits for its next token
    # seq_id -> [drafts, vocab]: the logits after each of its draft tokens (DecodeRow.drafts)
    drafts: dict[int, torch.Tensor] = field(default_factory=dict)
    prompt: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)  # seq_id -> (first position,
    # [chunk, vocab]) for prompt logprobs
    # seq_id -> [hidden] float32: the final norm's output at the prompt's last token (chunks that want it)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
