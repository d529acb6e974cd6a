"""SubscribeKvEvents: the blocks of the engine's prefix cache as the Shepherd gateway's
cache-aware policy reads them (smg-grpc-proto's KvEventBatch).

The gateway hashes each block's token ids itself (XXH3 per block, chained by position) and uses
our `block_hash` only as a name: to link a block to its parent and to remove it. So a block's
name is the first 8 bytes of its prefix-cache key (block_manager.block_hash, which already names
the whole prefix), as a signed int64. The blocks of a LoRA adapter's prompts carry its name
(`KvBlocksStored.lora_name`, smg's cache namespace), so a router keys them apart from the base model's.

Nothing is collected until the first subscriber: then the publisher becomes the block manager's
listener and keeps a mirror of the cached blocks (key -> position, parent, tokens), seeded with what
the cache held already (the block manager's `chains`), for the rest of the engine's life, so every
subscriber gets the state whole.
Each stream starts with a snapshot (cleared, then every mirrored block, parents first) and numbers
its batches from the subscriber's `start_sequence_number` + 1: the gateway skips numbers it has
seen and reconnects on a gap, so each stream's numbers run on without one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

from smg_grpc_proto.generated import common_pb2

from engine_service.core.block_manager import BlockManager

SUBSCRIBER_QUEUE_LIMIT = 10_000  # batches a stalled subscriber may owe before it is dropped (it reconnects)


def block_name(key: bytes) -> int:
    return int.from_bytes(key[:8], "little", signed=True)


class KvEventPublisher:
    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self.block_size = blocks.block_size
        self._lock = threading.Lock()  # the engine thread writes events and the mirror; the server's loop reads
        self._mirror: dict[bytes, tuple[int, bytes | None, list[int], str]] = {}  # position, parent, tokens, lora
        self._pending: list[common_pb2.KvCacheEvent] = []
        self._subscribers: list[asyncio.Queue[list[common_pb2.KvCacheEvent] | None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------ engine thread (BlockManager.listener)

    def stored(self, parent: bytes | None, blocks: list[tuple[bytes, list[int]]], first_position: int,
               lora_name: str = "") -> None:
        event = common_pb2.KvCacheEvent(stored=self._stored(parent, blocks, lora_name))
        with self._lock:
            for offset, (key, tokens) in enumerate(blocks):
                self._mirror[key] = (first_position + offset, parent if offset == 0 else blocks[offset - 1][0],
                                     tokens, lora_name)
            self._queue(event)

    def _stored(self, parent: bytes | None, blocks: list[tuple[bytes, list[int]]],
                lora_name: str) -> common_pb2.KvBlocksStored:
        """A chain of blocks under `parent`, with the LoRA adapter they were computed with (`lora_name`,
        smg's cache namespace: the blocks of the same tokens under another adapter hold other K/V)."""
        stored = common_pb2.KvBlocksStored(blocks=[common_pb2.KvBlock(
            block_hash=block_name(key), token_ids=tokens, block_size=self.block_size) for key, tokens in blocks])
        if parent is not None:
            stored.parent_block_hash = block_name(parent)
        if lora_name:
            stored.lora_name = lora_name
        return stored

    def removed(self, key: bytes) -> None:
        with self._lock:
            self._mirror.pop(key, None)
            self._queue(common_pb2.KvCacheEvent(removed=common_pb2.KvBlocksRemoved(block_hashes=[block_name(key)])))

    def cleared(self) -> None:
        with self._lock:
            self._mirror.clear()
            self._queue(common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared()))

    def _queue(self, event: common_pb2.KvCacheEvent) -> None:
        """One hop to the server's loop per engine step that changed the cache (under the lock)."""
        if not self._pending and self._loop is not None:
            self._loop.call_soon_threadsafe(self._fan_out)
        self._pending.append(event)

    # ------------------------------------------------------------ the server's loop

    def _fan_out(self) -> None:
        with self._lock:
            self._deliver_pending()

    def _deliver_pending(self) -> None:
        """The events not yet handed out, to every subscriber (the lock is held)."""
        events, self._pending = self._pending, []
        if not events:
            return
        for queue in list(self._subscribers):
            if queue.qsize() >= SUBSCRIBER_QUEUE_LIMIT:
                self._subscribers.remove(queue)
                queue.put_nowait(None)  # ends its stream; the gateway reconnects and gets a snapshot
            else:
                queue.put_nowait(events)

    def _seed(self) -> None:
        """The mirror from what the cache held before the listener was attached (the lock is held, so
        the engine thread's calls from now on wait). The engine thread updates `chains` before it
        calls the listener: a block stored or evicted meanwhile is either in the copy or in a call
        that follows, and the mirror's updates are idempotent."""
        for key, (parent, tokens, position, lora_name) in dict(self.blocks.chains).items():  # one atomic copy
            self._mirror[key] = (position, parent, tokens, lora_name)

    def _snapshot(self) -> list[common_pb2.KvCacheEvent]:
        events = [common_pb2.KvCacheEvent(cleared=common_pb2.KvCacheCleared())]
        for key, (_, parent, tokens, lora_name) in sorted(self._mirror.items(), key=lambda item: item[1][0]):
            events.append(common_pb2.KvCacheEvent(stored=self._stored(parent, [(key, tokens)], lora_name)))
        return events

    async def subscribe(self, start_sequence_number: int) -> AsyncIterator[common_pb2.KvEventBatch]:
        queue: asyncio.Queue[list[common_pb2.KvCacheEvent] | None] = asyncio.Queue()
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self.blocks.listener = self  # from here on, for the engine's life (the mirror must stay whole)
                self._seed()
            else:  # what the snapshot already holds must not reach the new stream again
                self._deliver_pending()
            first = self._snapshot()
            self._subscribers.append(queue)
        sequence = start_sequence_number
        events: list[common_pb2.KvCacheEvent] | None = first
        try:
            while events is not None:
                sequence += 1
                yield common_pb2.KvEventBatch(sequence_number=sequence, timestamp=time.time(), events=events)
                events = await queue.get()
        finally:
            with self._lock:
                if queue in self._subscribers:
                    self._subscribers.remove(queue)
