"""One generated choice (Sequence) and the request that owns its n choices (Request)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from engine_service.core.events import Event, FinishReason, TokenLogprob
from engine_service.core.params import RequestParams
from engine_service.core.speculation import Acceptance
from engine_service.text.reasoning import Phase, ReasoningTokens
from engine_service.text.tools import ToolSpec

if TYPE_CHECKING:
    from engine_service.core.adapters import Adapter
    from engine_service.text.constraints import Matcher
    from engine_service.text.output import OutputProcessor

_seq_ids = itertools.count()


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: RequestParams
    max_tokens: int  # already clipped to the context
    sink: Callable[[list[Event]], None]  # called from the engine thread with each step's events
    grammar: str | None = None  # constrained decoding (llguidance grammar)
    answer_grammar: str | None = None  # where `grammar` is tool calls or an answer: the answer's alone
    tools: ToolSpec | None = None  # output is parsed for tool calls when set
    # A reasoning model's chat: its markers' tokens, where its output starts, its thinking budget.
    reasoning: ReasoningTokens | None = None
    reasoning_phase: Phase = Phase.UNDECIDED
    max_reasoning_tokens: int | None = None
    sequences: list["Sequence"] = field(default_factory=list)
    outbox: list[Event] = field(default_factory=list)  # request-level events for the next sink call
    unsent_steps: int = 0  # steps that gave it tokens since its events were last sent
    log_id: str = ""  # the id the caller knows (x-request-id, else its request_id): in log lines about it
    arrival: float = 0.0  # time.monotonic() at submit, for latency metrics
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache at its first admission
    # An Embed (generation engines with enable_embeddings): each input's ids, one prefill-only sequence
    # each (params.n of them), ending at the end of its prompt with its last token's hidden row.
    inputs: list[list[int]] | None = None
    adapter: Adapter | None = None  # its LoRA adapter (core/adapters.py); None: the base model
    # Batch work (GenerateRequest.priority): admitted only into room interactive requests leave, and
    # preempted first when they need places or blocks (scheduler.py).
    batch: bool = False

    @property
    def cache_salt(self) -> bytes:
        """What its prompt's first prefix-cache block hangs under: KV of one adapter serves no other."""
        return b"" if self.adapter is None else self.adapter.cache_salt

    @property
    def adapter_slot(self) -> int:
        return 0 if self.adapter is None else self.adapter.slot

    @property
    def embeds(self) -> bool:
        return self.inputs is not None

    @property
    def finished(self) -> bool:
        return all(seq.finished for seq in self.sequences)


class Sequence:
    """A choice being generated: its tokens and cache blocks; `output` turns its tokens into text."""

    def __init__(self, request: Request, index: int, stop_ids: set[int], matcher: Matcher | None,
                 output: OutputProcessor | None) -> None:
        """output: None for an embedding's input (request.inputs[index] is its prompt)."""
        self.seq_id = next(_seq_ids)
        self.request = request
        self.index = index
        self.params = request.params
        prompt = request.prompt_ids if request.inputs is None else request.inputs[index]
        self.token_ids: list[int] = list(prompt)
        self.prompt_len = len(prompt)
        self.num_cached = 0
        self.block_table: list[int] = []
        # Prefix caching (see block_manager.py): the keys of its full token blocks, computed once,
        # and how many leading blocks of block_table were already offered to the cache.
        self.block_hashes: list[bytes] = []
        self.num_registered_blocks = 0
        self.stop_ids = stop_ids  # the sampler masks them until min_tokens
        self.matcher = matcher  # constrained decoding: masks the logits before sampling
        self.output = output
        self.finish_reason: FinishReason | None = None
        seed = request.params.sampling.seed
        self.generator: torch.Generator | None = None
        if seed is not None:
            self.generator = torch.Generator().manual_seed((seed + index) % (1 << 63))
        # Sibling choices (n > 1) waiting for this one's prompt to be prefilled.
        self.forks: list[Sequence] = []
        self.final_sent = False
        self.last_token_time = 0.0  # time.monotonic() of its last token (kept only with metrics on)
        # Echo with logprobs: one entry per prompt token (None for the first).
        self.prompt_logprobs: list[TokenLogprob | None] = [None]
        self.embedding: torch.Tensor | None = None  # an embedding's input: its vector once prefilled
        self.acceptance = Acceptance()  # of its draft tokens, with speculative decoding (core/speculation.py)

    @property
    def constrained(self) -> bool:
        """Whether the grammar masks this step (a reasoning model thinks freely before its answer)."""
        return self.matcher is not None and (self.output is None or self.output.answering)

    @property
    def forced_token(self) -> int | None:
        """The token this step must take: the end marker's next, once a thinking budget is spent."""
        return self.output.forced[0] if self.output is not None and self.output.forced else None

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_cached

    @property
    def is_decoding(self) -> bool:
        return self.num_uncomputed == 1 and self.num_output > 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
