"""An exact view of the token blocks one replica's prefix cache holds, from the engine's KV events
(engine_service/serving/kv_events.py), keyed as the engine keys them: by a hash chained over each block's
token ids, from the LoRA adapter's namespace (the events' `lora_name`: an adapter's blocks hold other K/V
than the base model's for the same tokens), so a prompt cut into the same blocks is held as far as its
leading blocks are (`match`).

Events arrive after the engine's step stored the blocks, so the router `expect`s the blocks of each
request it sends here until the events confirm them (or EXPECT_S passes): a burst sharing a new prefix
then does not scatter.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from itertools import takewhile

from smg_grpc_proto.generated import common_pb2

from .prefix import chained_blocks, namespace

# How long a block the router sent here counts as held before the engine's events say it is.
EXPECT_S = 30.0


def token_blocks(token_ids: Sequence[int], block_size: int, lora_name: str = "") -> list[int]:
    """A prompt's blocks as KvIndex keys them, for the LoRA adapter `lora_name` ("": the base model)."""
    return chained_blocks(tuple(token_ids), block_size, namespace(lora_name))


class KvIndex:
    """The blocks one engine's prefix cache holds, as its events said (plus those expected)."""

    def __init__(self) -> None:
        self.block_size = 0  # learned from the first stored block
        self.live = False  # while a stream of the engine's events keeps it in step (kv_feed.py)
        self._keys: dict[int, int] = {}  # the engine's block name -> the prefix key here
        self._held: Counter[int] = Counter()  # prefix key -> engine blocks holding it
        self._expected: OrderedDict[int, float] = OrderedDict()  # prefix key -> until when, oldest first
        self._lock = threading.Lock()  # the feed writes, requests read

    def __len__(self) -> int:
        """Blocks held (the router_replica_kv_blocks gauge, the log)."""
        return len(self._held)

    def apply(self, batch: common_pb2.KvEventBatch) -> None:
        with self._lock:
            for event in batch.events:
                kind = event.WhichOneof("data")
                if kind == "stored":
                    self._stored(event.stored)
                elif kind == "removed":
                    for name in event.removed.block_hashes:
                        self._forget(name)
                elif kind == "cleared":
                    self._clear()

    def _stored(self, stored: common_pb2.KvBlocksStored) -> None:
        parent = namespace(stored.lora_name)
        if stored.HasField("parent_block_hash"):
            found = self._keys.get(stored.parent_block_hash)
            if found is None:  # a parent never seen (or gone): the chain cannot be named
                return
            parent = found
        for block in stored.blocks:
            self.block_size = self.block_size or block.block_size or len(block.token_ids)
            parent = hash((parent, tuple(block.token_ids)))
            self._forget(block.block_hash)  # a name reused: the engine's old block under it is gone
            self._keys[block.block_hash] = parent
            self._held[parent] += 1
            self._expected.pop(parent, None)

    def _forget(self, name: int) -> None:
        key = self._keys.pop(name, None)
        if key is not None:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._keys.clear()
        self._held.clear()
        self._expected.clear()

    def expect(self, blocks: list[int]) -> None:
        """The router sent a request with these blocks here: count them held until the events say."""
        until = time.monotonic() + EXPECT_S
        with self._lock:
            for block in blocks:
                if block not in self._held:
                    self._expected[block] = until
                    self._expected.move_to_end(block)

    def match(self, blocks: list[int]) -> int:
        """How many of `blocks`, from the first, the engine holds (or is about to)."""
        now = time.monotonic()
        with self._lock:
            while self._expected and next(iter(self._expected.values())) < now:
                self._expected.popitem(last=False)
            return len(list(takewhile(lambda block: block in self._held or block in self._expected, blocks)))
