"""The scheduler and block manager on their own: real Sequences, no model, no processes.

Covers continuous batching (decodes first, then prompt chunks within the step budget),
chunked prefill, the batch-size cap, preemption when blocks run out, n>1 forking with shared
prompt blocks, and that every block comes back once sequences are released; and the KV cache's
size in blocks, from the engine's settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine_service.core.block_manager import BlockManager
from engine_service.core.inbox import Inbox
from engine_service.core.params import QueueFull, RequestParams, SamplingParams, StoppingParams
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence
from engine_service.model.kv_cache import kv_cache_blocks
from engine_service.model.step import Segments

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK = 4


class CopyLog:
    """Stands in for the KV cache: records which block contents were copied where."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, int]] = []

    def __call__(self, src: int, dst: int) -> None:
        self.copies.append((src, dst))


def make_seq(prompt_len: int, n: int = 1, batch: bool = False) -> Sequence:
    params = RequestParams(SamplingParams(), StoppingParams(), n=n)
    request = Request("r", list(range(1, prompt_len + 1)), params, max_tokens=100, sink=lambda events: None,
                      batch=batch)
    seqs = [Sequence(request, i, stop_ids=set(), matcher=None, output=None) for i in range(n)]
    request.sequences = seqs
    seqs[0].forks = seqs[1:]
    return seqs[0]


def make_scheduler(num_blocks: int = 64, max_batch: int = 8, step_tokens: int = 32,
                   prefix_caching: bool = True) -> tuple[Scheduler, CopyLog]:
    copies = CopyLog()
    return Scheduler(BlockManager(num_blocks, BLOCK, copies, prefix_caching), max_batch, step_tokens), copies


def run_step(scheduler: Scheduler) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
    """schedule(), advance(), then what the engine's sampler does: a token for each sequence that
    decoded or whose prompt is now whole."""
    batch = scheduler.schedule()
    scheduler.advance(batch)
    for seq in [*batch.decode, *(seq for seq, _ in batch.prefill)]:
        if seq.num_cached == len(seq.token_ids):
            seq.token_ids.append(7)
    return batch.decode, batch.prefill


def test_prompts_are_prefilled_in_whole_segments_within_the_step_budget_beside_decodes() -> None:
    """Chunks end on a prefill segment's boundary (here a block, 4 tokens) or at the prompt's end."""
    scheduler, _ = make_scheduler(step_tokens=10)
    short, long = make_seq(3), make_seq(25)
    scheduler.waiting.extend([short, long])
    decode, prefill = run_step(scheduler)
    assert decode == [] and [(s, n) for s, n in prefill] == [(short, 3), (long, 4)], "7 left: one segment"
    decode, prefill = run_step(scheduler)
    assert decode == [short] and prefill == [(long, 8)], "decodes first, the rest of the budget to the prompt"
    decode, prefill = run_step(scheduler)
    assert decode == [short] and prefill == [(long, 8)]
    decode, prefill = run_step(scheduler)
    assert decode == [short] and prefill == [(long, 5)], "the prompt's end needs no boundary"
    decode, prefill = run_step(scheduler)
    assert set(decode) == {short, long} and prefill == [], "the long prompt is whole and decoding"


def test_a_budget_short_of_a_segment_still_prefills_one_when_nothing_else_does() -> None:
    """Segments a block long up to 16 tokens, 16 long after."""
    segments = Segments(BLOCK, 4 * BLOCK)
    scheduler = Scheduler(BlockManager(64, BLOCK, CopyLog(), segments=segments), max_batch_size=8, max_step_tokens=10)
    first, second = make_seq(40), make_seq(40)
    scheduler.waiting.extend([first, second])
    _, prefill = run_step(scheduler)
    assert prefill == [(first, 8)], "two blocks within the budget; the other prompt's first block would not fit"
    _, prefill = run_step(scheduler)
    assert prefill == [(first, 8)]
    _, prefill = run_step(scheduler)
    assert prefill == [(first, 16)], "one segment over the budget; the other prompt waits"


def test_batch_size_caps_running_sequences_and_the_rest_wait() -> None:
    scheduler, _ = make_scheduler(max_batch=2)
    seqs = [make_seq(2) for _ in range(3)]
    scheduler.waiting.extend(seqs)
    run_step(scheduler)
    assert scheduler.running == seqs[:2] and list(scheduler.waiting) == seqs[2:]
    scheduler.release(seqs[0])  # a finished sequence makes room
    run_step(scheduler)
    assert scheduler.running == [seqs[1], seqs[2]]


def test_blocks_are_reserved_as_sequences_grow_and_all_return_on_release() -> None:
    scheduler, _ = make_scheduler(num_blocks=16)
    seq = make_seq(5)
    scheduler.waiting.append(seq)
    run_step(scheduler)
    assert len(seq.block_table) == 2  # 5 prompt tokens in blocks of 4 (plus room for the first new one)
    for _ in range(4):
        run_step(scheduler)
    assert len(seq.block_table) == -(-seq.num_cached // BLOCK)
    scheduler.release(seq)
    assert scheduler.blocks.num_free == 16 and seq.block_table == []


def test_out_of_blocks_preempts_the_newest_sequence_which_later_recomputes() -> None:
    # Without prefix caching: with it, the readmitted sequence would find its cached blocks
    # (tests/test_prefix_cache.py covers that).
    scheduler, _ = make_scheduler(num_blocks=4, prefix_caching=False)
    old, new = make_seq(4), make_seq(4)
    scheduler.waiting.extend([old, new])
    run_step(scheduler)  # both prompts fill one block each
    steps = 0
    while new in scheduler.running and steps < 20:
        run_step(scheduler)
        steps += 1
    assert new in scheduler.waiting and new.num_cached == 0 and new.block_table == [], "preempted, cache freed"
    assert old in scheduler.running, "the older sequence keeps running"
    scheduler.release(old)
    tokens = len(new.token_ids)
    decode, prefill = run_step(scheduler)
    assert prefill == [(new, tokens)], \
        "readmitted, it recomputes its prompt and the tokens it had generated"


def test_a_batch_sequence_is_never_admitted_ahead_of_a_waiting_interactive_one() -> None:
    """Batch work (GenerateRequest.priority BATCH) takes only the room interactive requests leave."""
    scheduler, _ = make_scheduler(max_batch=2)
    batch_first, live = make_seq(2, batch=True), make_seq(2)
    scheduler.waiting.extend([batch_first, live])
    _, prefill = run_step(scheduler)
    assert [seq for seq, _ in prefill] == [live, batch_first], "the interactive one first, though it came later"
    # The batch full of interactive sequences: a batch arrival waits, and when a place frees, the
    # interactive one behind it takes it.
    scheduler.release(batch_first)
    other_live, waiting_batch, late_live = make_seq(2), make_seq(2, batch=True), make_seq(2)
    scheduler.waiting.extend([other_live])
    run_step(scheduler)
    scheduler.waiting.extend([waiting_batch, late_live])
    run_step(scheduler)
    assert scheduler.running == [live, other_live] and list(scheduler.waiting) == [waiting_batch, late_live]
    scheduler.release(live)
    run_step(scheduler)
    assert late_live in scheduler.running and waiting_batch in scheduler.waiting


def test_a_batch_sequence_waits_while_an_interactive_one_cannot_get_its_blocks() -> None:
    """Never ahead of a waiting interactive request: not even into blocks too few for it."""
    scheduler, _ = make_scheduler(num_blocks=4, prefix_caching=False)
    running = make_seq(8)  # 2 blocks (3 once it decodes)
    scheduler.waiting.append(running)
    run_step(scheduler)
    big, small_batch = make_seq(8), make_seq(2, batch=True)  # 2 blocks needed, 1 free; the batch one needs 1
    scheduler.waiting.extend([big, small_batch])
    run_step(scheduler)
    assert list(scheduler.waiting) == [big, small_batch], "the batch sequence would fit, and still waits"
    scheduler.release(running)
    _, prefill = run_step(scheduler)
    assert [seq for seq, _ in prefill][0] is big


def test_an_interactive_arrival_preempts_the_newest_batch_sequence_when_there_is_no_room() -> None:
    scheduler, _ = make_scheduler(max_batch=2, prefix_caching=False)
    old_batch, new_batch = make_seq(3, batch=True), make_seq(3, batch=True)
    scheduler.waiting.extend([old_batch, new_batch])
    run_step(scheduler)
    run_step(scheduler)
    assert scheduler.running == [old_batch, new_batch]
    live = make_seq(3)
    scheduler.waiting.append(live)
    decode, prefill = run_step(scheduler)
    assert prefill == [(live, 3)] and decode == [old_batch], "admitted at once, in the preempted one's place"
    assert list(scheduler.waiting) == [new_batch] and new_batch.num_cached == 0 and new_batch.block_table == []
    assert scheduler.num_preemptions == 1
    scheduler.release(live)
    tokens = len(new_batch.token_ids)
    _, prefill = run_step(scheduler)
    assert prefill == [(new_batch, tokens)], "it recomputes once room returns"


def test_an_interactive_arrival_preempts_batch_sequences_for_kv_blocks() -> None:
    scheduler, _ = make_scheduler(num_blocks=4, prefix_caching=False)
    batch_seqs = [make_seq(4, batch=True), make_seq(4, batch=True)]  # 2 blocks each once they decode
    scheduler.waiting.extend(batch_seqs)
    run_step(scheduler)
    run_step(scheduler)
    assert scheduler.blocks.num_free == 0
    live = make_seq(6)  # 2 blocks
    scheduler.waiting.append(live)
    _, prefill = run_step(scheduler)
    assert prefill == [(live, 6)] and batch_seqs[1] in scheduler.waiting and batch_seqs[0] in scheduler.running


def test_an_interactive_decode_short_of_a_block_preempts_a_batch_sequence_not_a_newer_interactive_one() -> None:
    scheduler, _ = make_scheduler(num_blocks=3, prefix_caching=False)
    batch_seq, live, newer_live = make_seq(2, batch=True), make_seq(4), make_seq(3)
    scheduler.waiting.append(batch_seq)
    run_step(scheduler)  # the batch one runs alone first
    scheduler.waiting.extend([live, newer_live])
    run_step(scheduler)  # one block each: all three run
    assert scheduler.running == [batch_seq, live, newer_live] and scheduler.blocks.num_free == 0
    run_step(scheduler)  # `live` decodes its 6th token: a second block, none free
    assert batch_seq in scheduler.waiting and scheduler.running == [live, newer_live]
    assert len(live.block_table) == 2


def test_apart_a_step_with_interactive_work_holds_no_batch_sequence() -> None:
    """batch_apart (the CPU's default): batch sequences keep their cache and wait out interactive work."""
    scheduler = Scheduler(BlockManager(64, BLOCK, CopyLog()), max_batch_size=8, max_step_tokens=32, batch_apart=True)
    batch_seq = make_seq(3, batch=True)
    scheduler.waiting.append(batch_seq)
    run_step(scheduler)
    decode, _ = run_step(scheduler)
    assert decode == [batch_seq], "alone, it runs"
    live = make_seq(3)
    scheduler.waiting.append(live)
    decode, prefill = run_step(scheduler)
    assert decode == [] and prefill == [(live, 3)], "the step is the interactive request's alone"
    decode, _ = run_step(scheduler)
    assert decode == [live] and batch_seq in scheduler.running and batch_seq.block_table, "waiting, cache kept"
    scheduler.release(live)
    decode, _ = run_step(scheduler)
    assert decode == [batch_seq]
    long_batch = make_seq(30, batch=True)
    scheduler.waiting.append(long_batch)
    decode, prefill = run_step(scheduler)
    assert prefill == [(long_batch, 30)], "a batch step prefills as much as any step (it gives way mid-step)"
    shared = Scheduler(BlockManager(64, BLOCK, CopyLog()), max_batch_size=8, max_step_tokens=32)
    batch_seq, live = make_seq(3, batch=True), make_seq(3)
    shared.waiting.append(batch_seq)
    run_step(shared)
    shared.waiting.append(live)
    decode, prefill = run_step(shared)
    assert decode == [batch_seq] and prefill == [(live, 3)], "shared: the batch sequence fills the room beside it"


def test_a_request_waits_until_its_prompt_fits_in_free_blocks() -> None:
    scheduler, _ = make_scheduler(num_blocks=3)
    big, small = make_seq(13), make_seq(2)
    scheduler.waiting.extend([big, small])
    assert run_step(scheduler) == ([], []), "13 tokens need 4 blocks: it waits"
    assert list(scheduler.waiting) == [big, small], "first come, first served: the small one waits behind it"


def test_forks_share_full_prompt_blocks_and_copy_the_partial_one() -> None:
    scheduler, copies = make_scheduler(num_blocks=16)
    leader = make_seq(6, n=3)
    siblings = list(leader.forks)
    scheduler.waiting.append(leader)
    run_step(scheduler)
    assert scheduler.blocks.num_free == 14
    for sibling in siblings:
        scheduler.add_fork(leader, sibling)
    leader.forks = []
    full, partial = leader.block_table
    for sibling in siblings:
        assert sibling.block_table[0] == full, "the full prompt block is shared"
        assert sibling.block_table[1] != partial and (partial, sibling.block_table[1]) in copies.copies
        assert sibling.num_cached == leader.num_cached
    assert scheduler.blocks.num_free == 12, "one copied block per sibling, the full one shared"
    for seq in [leader, *siblings]:
        scheduler.release(seq)
    assert scheduler.blocks.num_free == 16, "the shared block returns once its last holder lets go"


def test_a_fork_without_a_free_block_recomputes_its_partial_block() -> None:
    scheduler, copies = make_scheduler(num_blocks=2)
    leader = make_seq(6, n=2)
    sibling = leader.forks[0]
    scheduler.waiting.append(leader)
    run_step(scheduler)
    assert scheduler.blocks.num_free == 0
    scheduler.add_fork(leader, sibling)
    assert sibling.block_table == leader.block_table[:1] and sibling.num_cached == BLOCK and not copies.copies


def test_n_choices_count_against_the_batch_size_before_they_fork() -> None:
    scheduler, _ = make_scheduler(max_batch=3)
    first, second = make_seq(2, n=2), make_seq(2, n=2)
    scheduler.waiting.extend([first, second])
    run_step(scheduler)
    assert scheduler.running == [first] and list(scheduler.waiting) == [second], "2 + 2 choices exceed 3 slots"


def test_requests_arriving_together_fill_free_slots_before_the_queue() -> None:
    # One slot, two waiting places: three requests that arrive before the loop's next step all fit
    # (the third once was refused: the first two counted as waiting though a slot was free).
    scheduler, _ = make_scheduler(max_batch=1)
    inbox = Inbox(max_waiting=2)

    def submit(seq: Sequence) -> None:
        inbox.put(seq.request, len(scheduler.waiting), scheduler.free_slots(), admit=lambda: None)

    seqs = [make_seq(2) for _ in range(4)]
    for seq in seqs[:3]:
        submit(seq)
    with pytest.raises(QueueFull):
        submit(seqs[3])
    taken, _ = inbox.take()  # the loop's step (the core makes each request's sequences)
    scheduler.waiting.extend(seq for seq in seqs if any(seq.request is request for request in taken))
    run_step(scheduler)
    assert scheduler.running == seqs[:1] and scheduler.free_slots() == 0
    with pytest.raises(QueueFull):
        submit(seqs[3])
    scheduler.release(seqs[0])
    scheduler.release(seqs[1])
    submit(seqs[3])  # a place in the queue again


def test_the_cache_is_sized_in_blocks_from_gigabytes_or_tokens_with_room_for_one_full_sequence() -> None:
    # 2 layers x K and V x 2 kv heads x 16 dims x 4 bytes: 512 bytes a token.
    model = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, hidden_size=64, num_attention_heads=4)
    # 1 MiB holds 2048 tokens: 128 blocks of 16, plus the runner's padding block.
    assert kv_cache_blocks(model, torch.float32, 16, max_model_len=256, gb=1 / 1024) == 129
    assert kv_cache_blocks(model, torch.bfloat16, 16, max_model_len=256, gb=1 / 1024) == 257
    model.head_dim = 32  # the config's own head_dim wins over hidden_size / heads
    assert kv_cache_blocks(model, torch.float32, 16, max_model_len=256, gb=1 / 1024) == 65
    # A token budget overrides the gigabytes: 100 tokens in 7 blocks (plus the padding block)...
    assert kv_cache_blocks(model, torch.float32, 16, max_model_len=32, tokens=100, gb=1.0) == 7 + 1
    # ...but a full-length sequence and a block more always fit: 256 + 16 tokens.
    assert kv_cache_blocks(model, torch.float32, 16, max_model_len=256, tokens=100) == 17 + 1
