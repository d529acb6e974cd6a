"""All KV-cache block accounting: which blocks each sequence holds, and which are free.

A sequence's block table lists the cache blocks that hold its tokens, in order. Blocks
are reference-counted: the n choices of one request share the full blocks of their
prompt, and a block returns to the free list when its last holder lets go. The cache
tensors themselves live with the model runner; copying a block's contents goes through
the `copy_block` callback it provides.
"""

from __future__ import annotations

from collections.abc import Callable

from engine_service.core.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, copy_block: Callable[[int, int], None]) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._copy_block = copy_block
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: block 0 first
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs to hold its first num_tokens tokens."""
        return max(-(-num_tokens // self.block_size) - len(seq.block_table), 0)

    def reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Give seq blocks for its first num_tokens tokens; False (and nothing taken) if too few are free."""
        needed = self.blocks_needed(seq, num_tokens)
        if needed > len(self._free):
            return False
        seq.block_table.extend(self._allocate() for _ in range(needed))
        return True

    def free(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
        seq.block_table = []

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child continues from parent's computed tokens: it shares parent's full blocks and gets a
        copy of the partial last one (or recomputes that part later when no block is free)."""
        full = parent.num_cached // self.block_size
        for block in parent.block_table[:full]:
            self._refs[block] += 1
        child.block_table = list(parent.block_table[:full])
        child.num_cached = full * self.block_size
        if parent.num_cached % self.block_size and self._free:
            block = self._allocate()
            self._copy_block(parent.block_table[full], block)
            child.block_table.append(block)
            child.num_cached = parent.num_cached

    def _allocate(self) -> int:
        block = self._free.pop()
        self._refs[block] = 1
        return block
