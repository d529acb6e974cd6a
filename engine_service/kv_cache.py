"""Paged KV cache: fixed-size blocks in preallocated tensors, handed out per sequence.

The budget is explicit (a number of blocks); a sequence holds a block table (list of
block ids). Blocks are reference-counted so the n choices of one request can share
the full blocks of their prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CacheShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int


class KVCache:
    """Per layer, K and V as [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(self, shape: CacheShape, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = shape
        slots = shape.num_blocks * shape.block_size
        self.keys = [torch.zeros(slots, shape.num_kv_heads, shape.head_dim, dtype=dtype, device=device)
                     for _ in range(shape.num_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.shape.block_size
        for k, v in zip(self.keys, self.values):
            k[dst * bs:(dst + 1) * bs] = k[src * bs:(src + 1) * bs]
            v[dst * bs:(dst + 1) * bs] = v[src * bs:(src + 1) * bs]


class BlockAllocator:
    """Hands out block ids; a block returns to the free list when its last holder frees it."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, block: int) -> None:
        self._refs[block] += 1

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
