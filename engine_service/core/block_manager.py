"""All KV-cache block accounting: which blocks each sequence holds, which are free, and which
full blocks are kept for reuse by content (prefix caching).

A sequence's block table lists the cache blocks that hold its tokens, in order. Blocks
are reference-counted: the n choices of one request share the full blocks of their
prompt, and a block is let go when its last holder lets go. The cache tensors themselves
live with the model runner; copying a block's contents goes through the `copy_block`
callback it provides.

Prefix caching (vLLM v1's scheme): once all of a block's tokens are in the cache, the block
is registered under a hash of (its parent block's hash, its token ids), so a hash names the
whole prefix up to the block's end and equal tokens at different offsets never match. The
token ids are the key, under the request's LoRA adapter (its salt is the first block's parent):
one engine serves one model in one dtype, and nothing else (images) changes the K/V. A new
sequence shares the longest run of registered blocks that starts its tokens (refcount + 1), cut
to a prompt segment's boundary (model/step.py: a prompt is computed segment by segment, so a hit
that ends on a boundary leaves the rest to compute as an uncached prompt would), and computes only
the rest. A released block
that holds a hash stays cached, evictable, in least-recently-released order; allocation takes
never-used (hashless) free blocks first, then evicts the least recently used cached block.
Evictable blocks count as free.

A `listener` (serving/kv_events.py, set once a gateway or router subscribes to KV events) is told
each block that enters the prefix cache and each that leaves it, on the engine thread; unset, it
costs a test per registration and eviction. So that the first subscriber learns what was cached
before it came, every cached block also keeps its chain (`chains`: parent key, token ids,
position, the LoRA adapter's name), a dict entry per registration. An unloaded adapter's blocks are
dropped (`drop_salted`), so its KV never outlives it.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from engine_service.core.sequence import Sequence
from engine_service.model.step import Segments


def block_hash(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block: sha256 over its parent's key and its token ids (collisions, which
    would serve another prompt's K/V, are out of reach, unlike with Python's 64-bit hash())."""
    return hashlib.sha256(parent + struct.pack(f"<{len(tokens)}I", *tokens)).digest()


class CacheListener(Protocol):
    def stored(self, parent: bytes | None, blocks: list[tuple[bytes, list[int]]], first_position: int,
               lora_name: str = "") -> None:
        """Blocks (key, token ids) entered the cache as one chain: the first at `first_position`
        (in blocks from the prompt's start) under `parent` (None at position 0), computed with the LoRA
        adapter `lora_name` ("": the base model)."""

    def removed(self, key: bytes) -> None: ...

    def cleared(self) -> None: ...


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, copy_block: Callable[[int, int], None],
                 enable_caching: bool = True, segments: Segments | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.segments = segments or Segments(block_size, block_size)  # where prompt segments begin: hits end there
        self.enable_caching = enable_caching
        self._copy_block = copy_block
        self._free = list(range(num_blocks - 1, -1, -1))  # hashless; popped from the end: block 0 first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced but cached, LRU first
        self._refs = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # hash -> the block that holds it
        # hash -> (its parent's hash, its token ids, its position, its LoRA adapter's name): the cache as KV
        # events describe it.
        self.chains: dict[bytes, tuple[bytes | None, list[int], int, str]] = {}
        # Prompt tokens looked up in the cache, and those found, at admissions (vLLM's counters).
        self.queries = 0
        self.hits = 0
        self.listener: CacheListener | None = None
        self.flush_requested = False  # any thread may set it: the next admission forgets the cache first

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs to hold its first num_tokens tokens."""
        return max(-(-num_tokens // self.block_size) - len(seq.block_table), 0)

    def reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Give seq blocks for its first num_tokens tokens; False (and nothing taken) if too few are free."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > self.num_free:
            return False
        seq.block_table.extend(self._allocate() for _ in range(needed))
        return True

    def admit(self, seq: Sequence, use_cache: bool) -> bool:
        """Give seq, which holds no blocks, blocks for all its tokens: with use_cache, the cached
        blocks that start its tokens are shared and counted in seq.num_cached. False (and nothing
        taken) if too few blocks are free.

        At least one token is left to compute, since the step needs its logits: a sequence whose
        tokens are all cached backs off its last block (recomputing a token into a shared block
        would overwrite it for the other holders)."""
        if self.flush_requested:
            self._forget_cached()
        matched = self._match(seq) if use_cache and self.enable_caching else []
        taken_from_lru = sum(1 for block in matched if self._refs[block] == 0)
        needed = -(-len(seq.token_ids) // self.block_size) - len(matched)
        if needed + taken_from_lru > self.num_free:
            return False
        for block in matched:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
        seq.block_table = matched
        seq.num_registered_blocks = len(matched)
        seq.num_cached = len(matched) * self.block_size
        seq.block_table.extend(self._allocate() for _ in range(needed))
        if use_cache and self.enable_caching:
            self.queries += len(seq.token_ids)
            self.hits += seq.num_cached
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """seq's computed tokens are in the cache: offer each block they fill to the prefix cache.
        A block whose content is already cached elsewhere (computed twice at once) stays private."""
        full = seq.num_cached // self.block_size
        if not self.enable_caching or full <= seq.num_registered_blocks:
            return
        hashes, size = self._hashes(seq, full), self.block_size
        first = seq.num_registered_blocks
        chain = [(hashes[i], seq.token_ids[i * size:(i + 1) * size]) for i in range(first, full)]
        lora_name = seq.request.adapter.name if seq.request.adapter is not None else ""
        for i, (key, tokens) in enumerate(chain, first):
            block = seq.block_table[i]
            if self._hash_of[block] is None and key not in self._cached:
                self._hash_of[block] = key
                self._cached[key] = block
                self.chains[key] = (hashes[i - 1] if i else None, tokens, i, lora_name)
        seq.num_registered_blocks = full
        # After the chains: a listener attached meanwhile finds these either there or in this call.
        if self.listener is not None:
            self.listener.stored(hashes[first - 1] if first else None, chain, first, lora_name)

    def free(self, seq: Sequence) -> None:
        # Last blocks first, so a sequence's tail is evicted before its head (a prefix needs the head).
        for block in reversed(seq.block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._hash_of[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None
        seq.block_table = []
        seq.num_registered_blocks = 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child continues from parent's computed tokens: it shares parent's full blocks and gets a
        copy of the partial last one (or recomputes that part later when no block is free)."""
        full = parent.num_cached // self.block_size
        for block in parent.block_table[:full]:
            self._refs[block] += 1
        child.block_table = list(parent.block_table[:full])
        child.num_cached = full * self.block_size
        child.block_hashes = list(parent.block_hashes[:full])
        child.num_registered_blocks = min(parent.num_registered_blocks, full)
        if parent.num_cached % self.block_size and self.num_free:
            block = self._allocate()
            self._copy_block(parent.block_table[full], block)
            child.block_table.append(block)
            child.num_cached = parent.num_cached

    def _match(self, seq: Sequence) -> list[int]:
        """The cached blocks that hold seq's leading tokens, short of its last token, to a segment's boundary."""
        limit = (len(seq.token_ids) - 1) // self.block_size
        matched = []
        for key in self._hashes(seq, limit):
            block = self._cached.get(key)
            if block is None:
                break
            matched.append(block)
        return matched[:self.segments.floor(len(matched) * self.block_size) // self.block_size]

    def _hashes(self, seq: Sequence, count: int) -> list[bytes]:
        """The keys of seq's first `count` full blocks (seq.block_hashes, extended as needed: its
        tokens never change, so neither do they)."""
        hashes, size = seq.block_hashes, self.block_size
        for i in range(len(hashes), count):
            hashes.append(block_hash(hashes[-1] if hashes else seq.request.cache_salt,
                                     seq.token_ids[i * size:(i + 1) * size]))
        return hashes[:count]

    def drop_salted(self, salt: bytes) -> int:
        """Forget the cached blocks of the prompts under `salt` (an unloaded LoRA adapter's): those nobody
        holds become free, held ones private. Returns how many. A block whose parent was evicted first is
        out of reach already (a lookup walks from a prompt's first block) and is left to eviction."""
        children: dict[bytes, list[bytes]] = {}
        found = []
        for key, (parent, tokens, _, _) in self.chains.items():
            if parent is not None:
                children.setdefault(parent, []).append(key)
            elif block_hash(salt, tokens) == key:
                found.append(key)
        for key in found:  # grows as it goes: each block's descendants
            found.extend(children.get(key, ()))
        for key in found:
            block = self._cached.pop(key)
            del self.chains[key]
            self._hash_of[block] = None
            if block in self._evictable:
                del self._evictable[block]
                self._free.append(block)
            if self.listener is not None:
                self.listener.removed(key)
        return len(found)

    def _allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        else:  # evict the least recently used cached block
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._hash_of[block]]
            del self.chains[self._hash_of[block]]
            if self.listener is not None:
                self.listener.removed(self._hash_of[block])
            self._hash_of[block] = None
        self._refs[block] = 1
        return block

    def _forget_cached(self) -> None:
        """Flush the prefix cache (FlushCache): unreferenced cached blocks become free, held ones
        private; nothing running is touched."""
        self.flush_requested = False
        for block in self._evictable:
            self._free.append(block)
        self._evictable.clear()
        for block in self._cached.values():
            self._hash_of[block] = None
        self._cached.clear()
        self.chains.clear()
        if self.listener is not None:
            self.listener.cleared()
