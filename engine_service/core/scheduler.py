"""Decides what each engine step computes: continuous batching with budgeted prefill.

Every step, all decoding sequences advance one token; the rest of the step's token
budget goes to prompt chunks (in-progress prefills first, then newly admitted
requests), so a long prompt is spread over several steps instead of stalling
everyone's decoding. A chunk ends on a prefill segment's boundary (model/step.py) or at the prompt's
end, so no segment is split across steps. When the KV cache runs out of blocks, the newest running
sequence is preempted: its blocks are freed and it is recomputed later.

Admission shares the prefix-cached blocks that start a sequence's tokens (block_manager.py),
so only the rest is prefilled; after a preemption this finds the sequence's own blocks again
unless they were evicted meanwhile. An Embed's inputs are prefill-only sequences like any other
prompt, finished at their prompt's end: they read the cache but offer it nothing (`advance`).
Requests that want their prompt's logprobs compute it all. A request of a LoRA adapter is admitted once its
adapter is resident (core/adapters.py: --max-loras at once); while every slot is held it waits, as for blocks.

Priorities: batch work (`Request.batch`, the shim's Batch API) takes only the room interactive
requests leave. A waiting interactive sequence is always admitted before any batch one (a batch
sequence never goes ahead of it, even when it cannot be admitted yet); one that finds no free place
or too few blocks first preempts running batch sequences, newest first; and when a decode needs a
block, a batch sequence is the victim before any interactive one. With `batch_apart` (the default on
the CPU, where a step's time grows with its rows: EngineConfig.batch_steps), a step that has interactive
work holds no batch sequence at all: they keep their cache and wait for a step without interactive work;
and a step of batch work alone stops between layers when an interactive request arrives (engine_core.py),
so that arrival waits for one layer of it, never the whole step.

After a step fails, recovery.py names the requests it suspects (`suspects`, by request id):
a step then holds the sequences of at most one suspect, beside any others, so the next
failure points at one request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine_service.core.block_manager import BlockManager
from engine_service.core.sequence import Sequence
from engine_service.model.step import DecodeRow, PromptChunk, StepInput

if TYPE_CHECKING:
    from engine_service.core.adapters import Adapter


@dataclass
class ScheduledBatch:
    decode: list[Sequence] = field(default_factory=list)
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, chunk length)
    drafts: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> draft tokens (core/speculation.py)

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)

    def sequences(self) -> list[Sequence]:
        return [*self.decode, *(seq for seq, _ in self.prefill)]

    def only_batch_work(self) -> bool:
        return all(seq.request.batch for seq in self.sequences())

    def step_input(self, wants_prompt_logprobs: set[int] = frozenset(), wants_hidden: set[int] = frozenset()
                   ) -> StepInput:
        """What the model runner reads of this batch; `wants_prompt_logprobs`: the sequences (by
        seq_id) whose prompt chunks keep every logits row (prompt_logprobs.wanted); `wants_hidden`:
        those whose prompt's last token gives its hidden row (an Embed's inputs: `embedding_inputs`)."""
        decode = [DecodeRow(seq.seq_id, seq.token_ids[seq.num_cached], seq.num_cached, seq.block_table,
                            self.drafts.get(seq.seq_id, []), seq.request.adapter_slot)
                  for seq in self.decode]
        prefill = [PromptChunk(seq.seq_id, seq.token_ids[seq.num_cached:seq.num_cached + length], seq.num_cached,
                               seq.block_table, ends_prompt=seq.num_cached + length == len(seq.token_ids),
                               keep_all_rows=seq.seq_id in wants_prompt_logprobs,
                               wants_hidden=seq.seq_id in wants_hidden, adapter=seq.request.adapter_slot)
                   for seq, length in self.prefill]
        return StepInput(decode, prefill)


def embedding_inputs(batch: ScheduledBatch) -> set[int]:
    """The seq_ids of the batch's prompt chunks that are an Embed's inputs."""
    return {seq.seq_id for seq, _ in batch.prefill if seq.request.embeds}


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch_size: int, max_step_tokens: int,
                 batch_apart: bool = False) -> None:
        self.blocks = blocks
        self.batch_apart = batch_apart
        self.max_batch_size = max_batch_size
        self.max_step_tokens = max_step_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.suspects: set[str] = set()  # request ids; see the module docstring
        self.num_preemptions = 0  # for lack of KV-cache blocks, since the start
        # LoRA adapters (core/adapters.py): residency(adapter, held) makes a waiting sequence's adapter resident.
        self.adapter_residency: Callable[[Adapter, set[Adapter]], bool] | None = None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        allowed = _OneSuspect(self.suspects)
        self._yield_to_interactive()
        with_batch_work = not (self.batch_apart and self._interactive_work())
        # Interactive decodes reserve their blocks first: a batch victim is then never one already scheduled.
        for seq in sorted(self.running, key=_is_batch):
            if seq.request.batch and not with_batch_work:
                break  # (sorted: the batch sequences come last)
            if seq.is_decoding and allowed(seq) and self._make_room(seq):
                batch.decode.append(seq)
        budget = self.max_step_tokens - len(batch.decode)
        # Prompt chunks: interactive prompts under way, then interactive arrivals, then batch prompts
        # under way, then batch arrivals (none while an interactive one waits). Without batch work this
        # is prompts under way, then arrivals.
        budget = self._prefill_running(batch, budget, allowed, batch_work=False)
        budget = self._admit_waiting(batch, budget, allowed, batch_work=False)
        if with_batch_work:
            budget = self._prefill_running(batch, budget, allowed, batch_work=True)
            self._admit_waiting(batch, budget, allowed, batch_work=True)
        return batch

    def _interactive_work(self) -> bool:
        return any(not seq.request.batch for seq in self.running) or any(not seq.request.batch for seq in self.waiting)

    def _prefill_running(self, batch: ScheduledBatch, budget: int, allowed: _OneSuspect, batch_work: bool) -> int:
        for seq in self.running:
            if budget <= 0:
                break
            if seq.request.batch == batch_work and not seq.is_decoding and allowed(seq):
                chunk = self._chunk(seq, budget, batch)
                if not chunk or not self.blocks.reserve(seq, seq.num_cached + chunk):
                    continue
                batch.prefill.append((seq, chunk))
                budget -= chunk
        return budget

    def _admit_waiting(self, batch: ScheduledBatch, budget: int, allowed: _OneSuspect, batch_work: bool) -> int:
        """Admits waiting sequences of one kind in order; batch ones only while no interactive one waits."""
        while self.waiting and budget > 0:
            seq = self._next_waiting()
            if seq.request.batch != batch_work:
                break
            if self._batch_slots_used() + self._slots(seq) > self.max_batch_size:
                break
            if not allowed(seq) or not self._adapter_resident(seq) or not self._admit(seq):
                break
            self.waiting.remove(seq)
            self.running.append(seq)
            chunk = self._chunk(seq, budget, batch)
            if chunk:
                batch.prefill.append((seq, chunk))
                budget -= chunk
        return budget

    def _next_waiting(self) -> Sequence:
        """The first waiting interactive sequence, else the first waiting one (batch)."""
        return next((seq for seq in self.waiting if not seq.request.batch), self.waiting[0])

    def _yield_to_interactive(self) -> None:
        """Preempts running batch sequences, newest first, until the first waiting interactive one
        has a place and the blocks its tokens need (cached prefixes not counted: it may take one more)."""
        waiting = next((seq for seq in self.waiting if not seq.request.batch), None)
        if waiting is None:
            return
        needed = -(-len(waiting.token_ids) // self.blocks.block_size)
        while (self._batch_slots_used() + self._slots(waiting) > self.max_batch_size
               or self.blocks.num_free < needed):
            victim = next((seq for seq in reversed(self.running) if seq.request.batch), None)
            if victim is None:
                return
            self.preempt(victim)
            self.num_preemptions += 1

    def _chunk(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> int:
        """Prompt tokens seq computes this step: the rest of its prompt if the budget holds it, else
        whole segments within the budget; one segment over it when the step prefills nothing else
        (a budget left short of a segment by many decodes must not starve the prompts)."""
        if seq.num_uncomputed <= budget:
            return seq.num_uncomputed
        segments, start = self.blocks.segments, seq.num_cached
        end = segments.floor(start + budget)
        if end <= start and not batch.prefill:
            end = segments.next(start)
        return max(0, end - start)

    def advance(self, batch: ScheduledBatch) -> None:
        """After the model ran the batch: its tokens are in the cache, and the blocks they fill
        can be shared. An embedding's blocks are not offered: it reads cached prefixes (the same
        keys and values) but a burst of documents would otherwise evict the chats' prefixes."""
        for seq in batch.decode:
            seq.num_cached += 1
            self.blocks.register_full_blocks(seq)
        for seq, length in batch.prefill:
            seq.num_cached += length
            if not seq.request.embeds:
                self.blocks.register_full_blocks(seq)

    def accepted(self, seq: Sequence, count: int) -> None:
        """`count` of seq's draft tokens were taken: their keys and values, computed in the step, are its."""
        seq.num_cached += count
        self.blocks.register_full_blocks(seq)

    def _adapter_resident(self, seq: Sequence) -> bool:
        """The LoRA adapter of seq, if any, is in the linears (or now brought in: core/adapters.py); False
        while every slot is held by the running sequences' adapters: seq waits."""
        adapter = seq.request.adapter
        if adapter is None or self.adapter_residency is None:
            return True
        return self.adapter_residency(adapter, {s.request.adapter for s in self.running if s.request.adapter})

    def _admit(self, seq: Sequence) -> bool:
        """Blocks for all of seq's tokens, cached ones shared; the request's cached_tokens is what
        its first admission found."""
        if not self.blocks.admit(seq, use_cache=not seq.params.wants_prompt_logprobs):
            return False
        if seq.request.cached_tokens is None:
            seq.request.cached_tokens = min(seq.num_cached, seq.prompt_len)
        return True

    def free_slots(self) -> int:
        """Places left in the running batch (read from any thread: a snapshot)."""
        return max(0, self.max_batch_size - self._batch_slots_used())

    def _batch_slots_used(self) -> int:
        return sum(self._slots(seq) for seq in self.running)

    @staticmethod
    def _slots(seq: Sequence) -> int:
        return 1 + len(seq.forks)  # choices that will join once the prompt is prefilled

    def _make_room(self, seq: Sequence) -> bool:
        """Ensure seq has a block for its next token, preempting newer sequences if needed: the newest
        batch sequence first (so a batch sequence only ever preempts batch ones)."""
        while not self.blocks.reserve(seq, seq.num_cached + 1):
            victim = next((s for s in reversed(self.running) if s.request.batch), self.running[-1])
            self.preempt(victim)
            self.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free seq's cache and put it first in line; it recomputes its tokens when readmitted."""
        self.release(seq)
        seq.num_cached = 0
        self.waiting.appendleft(seq)

    def add_fork(self, parent: Sequence, child: Sequence) -> None:
        """n > 1: a sibling choice joins the batch from its parent's prefilled prompt."""
        self.blocks.fork(parent, child)
        self.running.append(child)

    def release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)


def _is_batch(seq: Sequence) -> bool:
    return seq.request.batch


class _OneSuspect:
    """Admits every sequence of the first suspected request it is asked about, and none of the
    other suspects' (a no-op without suspects)."""

    def __init__(self, suspects: set[str]) -> None:
        self.suspects = suspects
        self.chosen: str | None = None

    def __call__(self, seq: Sequence) -> bool:
        if not self.suspects:
            return True
        request_id = seq.request.request_id
        if request_id not in self.suspects:
            return True
        if self.chosen is None:
            self.chosen = request_id
        return self.chosen == request_id
