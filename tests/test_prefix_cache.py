"""Prefix caching in the block manager and scheduler: real Sequences, no model, no processes.

Covers matching by a hash chain (equal blocks at other offsets never match), sharing and
reference counts, a partial last block never shared, the last token always computed,
least-recently-used eviction, hits after preemption, no matching for prompt logprobs, n>1
forks, the switch off, and the metrics counters."""

from __future__ import annotations

import pytest

from engine_service.core.block_manager import BlockManager
from engine_service.core.metrics import EngineMetrics, Load, StepRecorder
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.scheduler import Scheduler
from engine_service.core.sequence import Request, Sequence

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK = 4


def make_seq(tokens: list[int], n: int = 1, echo_logprobs: bool = False) -> Sequence:
    params = RequestParams(SamplingParams(), StoppingParams(), n=n, logprobs=echo_logprobs, echo=echo_logprobs)
    request = Request("r", list(tokens), params, max_tokens=100, sink=lambda events: None)
    seqs = [Sequence(request, i, stop_ids=set(), matcher=None, output=None) for i in range(n)]
    request.sequences = seqs
    seqs[0].forks = seqs[1:]
    return seqs[0]


def make_blocks(num_blocks: int = 16, caching: bool = True) -> BlockManager:
    return BlockManager(num_blocks, BLOCK, lambda src, dst: None, caching)


def compute(blocks: BlockManager, seq: Sequence) -> None:
    """What a step does for an admitted sequence: all its tokens into the cache, full blocks offered."""
    seq.num_cached = len(seq.token_ids)
    blocks.register_full_blocks(seq)


def admitted(blocks: BlockManager, tokens: list[int]) -> Sequence:
    seq = make_seq(tokens)
    assert blocks.admit(seq, use_cache=True)
    return seq


def test_a_second_sequence_shares_the_cached_full_blocks_of_its_prefix() -> None:
    blocks = make_blocks()
    first = admitted(blocks, list(range(10)))  # blocks [0-3] [4-7] and a partial [8 9]
    compute(blocks, first)
    second = admitted(blocks, list(range(8)) + [50, 51, 52])
    assert second.num_cached == 8 and second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] not in first.block_table, "the partial last block is never shared"
    assert blocks.hits == 8 and blocks.queries == 10 + 11


def test_equal_blocks_at_other_offsets_do_not_match() -> None:
    blocks = make_blocks()
    compute(blocks, admitted(blocks, [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    shifted = admitted(blocks, [5, 6, 7, 8, 1, 2, 3, 4, 9])  # [5 6 7 8] is cached, but after [1 2 3 4]
    assert shifted.num_cached == 0
    diverging = admitted(blocks, [1, 2, 3, 4, 0, 6, 7, 8, 9])
    assert diverging.num_cached == BLOCK, "the match stops at the first block that differs"


def test_the_last_token_is_always_computed() -> None:
    blocks = make_blocks()
    compute(blocks, admitted(blocks, list(range(8))))
    again = admitted(blocks, list(range(8)))
    assert again.num_cached == BLOCK, "a fully cached prompt backs off its last block"
    longer = admitted(blocks, list(range(9)))
    assert longer.num_cached == 8


def test_shared_blocks_are_reference_counted_and_stay_cached_after_release() -> None:
    blocks = make_blocks(num_blocks=8)
    first = admitted(blocks, list(range(9)))
    compute(blocks, first)
    second = admitted(blocks, list(range(9)))
    shared = first.block_table[:2]
    assert blocks.num_free == 8 - 3 - 1, "two full blocks shared, a partial block each"
    blocks.free(first)
    assert blocks.num_free == 8 - 3, "the shared blocks are still held by the second"
    blocks.free(second)
    assert blocks.num_free == 8, "cached blocks nobody holds count as free"
    third = admitted(blocks, list(range(9)))
    assert third.num_cached == 8 and third.block_table[:2] == shared


def test_allocation_takes_never_used_blocks_first_then_evicts_the_least_recently_used() -> None:
    blocks = make_blocks(num_blocks=6)
    old_prompt, new_prompt = [1, 1, 1, 1, 2, 2, 2, 2, 0], [3, 3, 3, 3, 4, 4, 4, 4, 0]
    for prompt in (old_prompt, new_prompt):  # two full blocks each stay cached; partial ones are plain free
        seq = admitted(blocks, prompt)
        compute(blocks, seq)
        blocks.free(seq)
    assert blocks.num_free == 6
    blocks.free(admitted(blocks, [9] * 8))  # two blocks: the two plain free ones, no eviction
    assert admitted(blocks, old_prompt).num_cached == 8
    blocks = make_blocks(num_blocks=6)
    for prompt in (old_prompt, new_prompt):
        seq = admitted(blocks, prompt)
        compute(blocks, seq)
        blocks.free(seq)
    blocks.free(admitted(blocks, [8] * 16))  # four blocks: two plain free, then two evicted
    assert admitted(blocks, new_prompt).num_cached == 8, "the newer prompt is still cached"
    assert admitted(blocks, old_prompt).num_cached == 0, "the older prompt was evicted"


def test_a_sequence_frees_its_tail_for_eviction_before_its_head() -> None:
    blocks = make_blocks(num_blocks=4)
    seq = admitted(blocks, list(range(13)))  # three full blocks and a partial one
    compute(blocks, seq)
    blocks.free(seq)
    other = admitted(blocks, [9] * 8)  # the plain free block, then one eviction
    blocks.free(other)
    assert admitted(blocks, list(range(13))).num_cached == 8, "its third block went, the first two stayed"


def test_admission_fails_whole_when_cached_and_new_blocks_do_not_fit() -> None:
    blocks = make_blocks(num_blocks=4)
    first = admitted(blocks, list(range(9)))
    compute(blocks, first)
    blocks.free(first)
    holder = admitted(blocks, [7] * 4)  # holds one block: three free, two of them cached
    seq = make_seq(list(range(8)) + list(range(20, 24)) + [0])  # 2 cached blocks + 2 new needed
    assert not blocks.admit(seq, use_cache=True)
    assert seq.block_table == [] and blocks.num_free == 3, "nothing taken"
    blocks.free(holder)
    assert blocks.admit(seq, use_cache=True) and seq.num_cached == 8


def test_generated_tokens_fill_blocks_that_the_next_turn_finds() -> None:
    scheduler = Scheduler(make_blocks(), max_batch_size=4, max_step_tokens=64)
    seq = make_seq([1, 2, 3, 4, 5, 6])
    scheduler.waiting.append(seq)
    for answer_token in [40, 41, 42, 43]:
        batch = scheduler.schedule()
        scheduler.advance(batch)
        seq.token_ids.append(answer_token)
    scheduler.release(seq)  # 6 prompt + 3 computed answer tokens: two full blocks registered
    follow_up = make_seq([1, 2, 3, 4, 5, 6, 40, 41, 42, 43, 60, 61])
    scheduler.waiting.append(follow_up)
    scheduler.schedule()
    assert follow_up.num_cached == 8 and follow_up.request.cached_tokens == 8


def test_a_preempted_sequence_finds_its_blocks_again() -> None:
    scheduler = Scheduler(make_blocks(num_blocks=8), max_batch_size=4, max_step_tokens=64)
    seq = make_seq(list(range(10)))
    scheduler.waiting.append(seq)
    for token in [40, 41, 42]:
        scheduler.advance(scheduler.schedule())
        seq.token_ids.append(token)
    scheduler.preempt(seq)
    assert seq.num_cached == 0 and seq.block_table == []
    batch = scheduler.schedule()
    assert batch.prefill == [(seq, 1)], "12 of its 13 tokens are cached: it recomputes only the last"
    assert seq.request.cached_tokens == 0, "cached_tokens is what the first admission found"


def test_requests_that_want_prompt_logprobs_compute_their_whole_prompt() -> None:
    scheduler = Scheduler(make_blocks(), max_batch_size=4, max_step_tokens=64)
    warm = make_seq(list(range(9)))
    scheduler.waiting.append(warm)
    scheduler.advance(scheduler.schedule())
    scheduler.release(warm)
    echo = make_seq(list(range(9)), echo_logprobs=True)
    scheduler.waiting.append(echo)
    batch = scheduler.schedule()
    assert batch.prefill == [(echo, 9)] and echo.request.cached_tokens == 0


def test_forks_share_cached_prompt_blocks_and_register_their_own() -> None:
    blocks = make_blocks()
    leader = admitted(blocks, list(range(6)))
    child = make_seq(list(range(6)))
    compute(blocks, leader)
    blocks.fork(leader, child)
    assert child.block_table[0] == leader.block_table[0] and child.num_registered_blocks == 1
    child.token_ids += [7, 8]
    child.num_cached = 8
    blocks.register_full_blocks(child)
    assert admitted(blocks, list(range(6)) + [7, 8, 9]).num_cached == 8, "the child's own full block is cached"


def test_with_caching_off_nothing_is_matched() -> None:
    blocks = make_blocks(caching=False)
    compute(blocks, admitted(blocks, list(range(9))))
    again = admitted(blocks, list(range(9)))
    assert again.num_cached == 0 and blocks.queries == blocks.hits == 0


def test_prefix_cache_counters_are_published_in_tokens() -> None:
    metrics = EngineMetrics("m")
    recorder = StepRecorder(metrics)
    recorder.publish(None, Load(0, 0, 0.0), 0, prefix_queries=30, prefix_hits=16)
    recorder.publish(None, Load(0, 0, 0.0), 0, prefix_queries=40, prefix_hits=24)

    def value(name: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m"})

    assert value("conduit:prefix_cache_queries_total") == 40
    assert value("conduit:prefix_cache_hits_total") == 24
