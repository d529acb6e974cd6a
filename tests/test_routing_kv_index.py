"""The shim router's exact prefix view (http_shim/routing/kv_index.py), fed by the engine's own KV events:
the events the engine's block manager publishes (serving/kv_events.py, in this process) name the blocks a
prompt's token ids cut into; blocks removed, cleared or chained to an unknown parent are not held; blocks
the router sent a request to count until the events confirm them or they expire; cache_aware follows the
view it is given; a prompt is tokenized by an engine once, a short one not at all. tests/test_stack_replicas.py runs it on real engines."""

from __future__ import annotations

import grpc
import pytest

from clients.errors import from_status
from conduit.v1 import engine_pb2 as pb
from engine_service.core.block_manager import BlockManager
from engine_service.serving.kv_events import KvEventPublisher
from http_shim.routing import kv_index
from http_shim.routing.kv_index import KvIndex, token_blocks
from http_shim.routing.policies import CacheAware, Choice
from http_shim.routing.prefix import PrefixIndex
from http_shim.routing.request_prefix import RequestPrefix
from smg_grpc_proto.generated import common_pb2
from test_vllm_worker_units import BLOCK, Subscriber, admitted, computed, loop  # noqa: F401 (loop: a fixture)

pytestmark = pytest.mark.in_process_engine  # the engine's block manager, in this process (conftest.py)

PROMPT = [50 + t for t in range(10)]  # two full blocks of 4, and two tokens over


def batch(*events: common_pb2.KvCacheEvent) -> common_pb2.KvEventBatch:
    return common_pb2.KvEventBatch(sequence_number=1, events=events)


def stored(tokens: list[list[int]], names: list[int], parent: int | None = None) -> common_pb2.KvCacheEvent:
    event = common_pb2.KvBlocksStored(blocks=[common_pb2.KvBlock(block_hash=name, token_ids=block, block_size=BLOCK)
                                              for name, block in zip(names, tokens)])
    if parent is not None:
        event.parent_block_hash = parent
    return common_pb2.KvCacheEvent(stored=event)


def test_the_engines_events_name_the_blocks_a_prompts_token_ids_cut_into(loop) -> None:
    blocks = BlockManager(8, BLOCK, lambda src, dst: None)
    subscriber = Subscriber(KvEventPublisher(blocks), loop)
    index = KvIndex()
    index.apply(subscriber.next())  # the snapshot: nothing yet

    held = computed(blocks, PROMPT)
    longer = admitted(blocks, PROMPT[:8] + [7, 7, 7, 7, 7])  # shares two blocks, fills a third
    longer.num_cached = len(longer.token_ids)
    blocks.register_full_blocks(longer)
    subscriber.settle()
    index.apply(subscriber.next())
    assert index.block_size == BLOCK and len(index) == 3
    assert index.match(token_blocks(PROMPT + [1, 2, 3], BLOCK)) == 2
    assert index.match(token_blocks(PROMPT[:8] + [7, 7, 7, 7, 0], BLOCK)) == 3
    assert index.match(token_blocks(PROMPT[:4] + [0] * 8, BLOCK)) == 1  # a block stands for all before it
    assert index.match(token_blocks([0] * 4 + PROMPT[4:], BLOCK)) == 0

    blocks.free(held)
    blocks.free(longer)
    admitted(blocks, [90 + t for t in range(8 * BLOCK - 1)])  # takes every block: the cached ones are evicted
    subscriber.settle()
    index.apply(subscriber.next())
    assert len(index) == 0 and index.match(token_blocks(PROMPT, BLOCK)) == 0


def test_removed_cleared_and_orphaned_blocks_are_not_held() -> None:
    index = KvIndex()
    index.apply(batch(stored([[1, 2, 3, 4], [5, 6, 7, 8]], [11, 12])))
    mine = token_blocks([1, 2, 3, 4, 5, 6, 7, 8], BLOCK)
    assert index.match(mine) == 2
    index.apply(batch(common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=[12]))))
    assert index.match(mine) == 1 and len(index) == 1
    index.apply(batch(stored([[9, 9, 9, 9]], [13], parent=999)))  # its parent was never seen: unnamed
    assert len(index) == 1
    index.apply(batch(stored([[5, 6, 7, 8]], [14], parent=11)))  # chained to a known parent
    assert index.match(mine) == 2
    index.apply(batch(common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())))
    assert len(index) == 0 and index.match(mine) == 0


def test_blocks_sent_there_count_until_the_events_confirm_them_or_they_expire(monkeypatch) -> None:
    index = KvIndex()
    mine = token_blocks([1, 2, 3, 4, 5, 6, 7, 8], BLOCK)
    index.expect(mine)
    assert index.match(mine) == 2 and len(index) == 0  # expected, not yet held
    index.apply(batch(stored([[1, 2, 3, 4], [5, 6, 7, 8]], [11, 12])))
    index.apply(batch(common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=[11, 12]))))
    assert index.match(mine) == 0, "confirmed, then evicted: no longer expected either"

    monkeypatch.setattr(kv_index, "EXPECT_S", -1.0)  # a request that never reached the cache
    index.expect(mine)
    assert index.match(mine) == 0


class StandIn:
    def __init__(self, address: str, load: int = 0) -> None:
        self.address = address
        self.load = load
        self.index = KvIndex()
        self.prefixes = PrefixIndex()  # the text view: what this shim sent there


def test_cache_aware_matches_in_the_view_it_is_given_and_places_by_what_it_sent() -> None:
    a, b = StandIn("a"), StandIn("b")
    policy, view = CacheAware(), (lambda replica: replica.index)
    mine = token_blocks(list(range(40)), BLOCK)
    assert policy.choose([a, b], mine, view) == Choice(a, "cache_miss")
    b.index.apply(batch(stored([list(range(k, k + BLOCK)) for k in range(0, 40, BLOCK)], list(range(1, 11)))))
    assert policy.choose([a, b], mine, view) == Choice(b, "cache_hit")
    a.index.apply(batch(stored([[7] * BLOCK], [99])))  # a's cache holds fewer blocks, but this shim sent it more:
    a.prefixes.add([1, 2, 3])  # a new prefix goes to b (a warm engine's cache is always full: no measure of room)
    assert policy.choose([a, b], token_blocks(list(range(100, 140)), BLOCK), view) == Choice(b, "cache_miss")


class Tokenizer:
    """An engine client's tokenize(), counting its calls; `fails`: the engine refuses it."""

    def __init__(self, fails: bool = False) -> None:
        self.calls = 0
        self.fails = fails

    def tokenize(self, *, request, timeout, metadata):
        self.calls += 1
        if self.fails:
            raise from_status(grpc.StatusCode.UNAVAILABLE, "down")
        assert request.chat.messages[0].content == LONG and request.model == "m"
        return pb.TokenizeResponse(token_ids=list(range(300)))


LONG = "a long system prompt " * 20


def test_a_prompt_is_tokenized_once_by_an_engine_and_a_short_one_not_at_all() -> None:
    engine = Tokenizer()
    prefix = RequestPrefix("m", pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="user",
                                                                                              content=LONG)])))
    assert prefix.token_blocks(engine, 16) == token_blocks(list(range(300)), 16)
    assert prefix.token_blocks(engine, 16) and engine.calls == 1  # again on a retry elsewhere: asked once

    short = RequestPrefix("m", pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="user",
                                                                                             content="Hi")])))
    assert short.token_blocks(engine, 16) == [] and engine.calls == 1  # placed by load, nothing asked
    given = RequestPrefix("m", pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(200)))))
    assert given.token_blocks(engine, 16) == [] and engine.calls == 1  # its own ids, under MIN_PROMPT_TOKENS

    down = RequestPrefix("m", pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="user",
                                                                                            content=LONG)])))
    assert down.token_blocks(Tokenizer(fails=True), 16) is None  # routed by the text view


def test_an_adapters_blocks_are_keyed_apart_and_dropped_when_it_is_unloaded(loop) -> None:
    """The same tokens under a LoRA adapter hold other K/V: the events carry its name (lora_name), the index keys
    its blocks under it, and the router's blocks for a request to it (token_blocks(..., name)) find them, the
    base model's do not; unloading it (drop_salted) removes them, a late subscriber's snapshot included."""
    from engine_service.core.adapters import Adapter
    from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
    from engine_service.core.sequence import Request, Sequence

    blocks = BlockManager(8, BLOCK, lambda src, dst: None)
    publisher = KvEventPublisher(blocks)
    subscriber = Subscriber(publisher, loop)
    index = KvIndex()
    index.apply(subscriber.next())
    adapter = Adapter("sql", "/adapters/sql", 1, 4, b"salt-of-one-load")
    request = Request("a", list(PROMPT), RequestParams(SamplingParams(), StoppingParams()), max_tokens=100,
                      sink=lambda events: None, adapter=adapter)
    seq = Sequence(request, 0, stop_ids=set(), matcher=None, output=None)
    assert blocks.admit(seq, use_cache=True)
    seq.num_cached = len(seq.token_ids)
    blocks.register_full_blocks(seq)
    subscriber.settle()
    index.apply(subscriber.next())
    assert len(index) == 2
    assert index.match(token_blocks(PROMPT, BLOCK, "sql")) == 2
    assert index.match(token_blocks(PROMPT, BLOCK)) == 0 and index.match(token_blocks(PROMPT, BLOCK, "other")) == 0
    late = KvIndex()
    late.apply(Subscriber(publisher, loop).next())  # its snapshot
    assert late.match(token_blocks(PROMPT, BLOCK, "sql")) == 2

    base = computed(blocks, PROMPT)  # the base model's own blocks of the same tokens stay
    blocks.free(seq)
    assert blocks.drop_salted(adapter.cache_salt) == 2 and len(blocks.chains) == 2
    subscriber.settle()
    index.apply(subscriber.next())  # one batch: the base model's blocks stored, the adapter's removed
    assert index.match(token_blocks(PROMPT, BLOCK, "sql")) == 0 and index.match(token_blocks(PROMPT, BLOCK)) == 2
    assert blocks.num_free == 8 - len(base.block_table)  # the adapter's blocks are free, not cached
