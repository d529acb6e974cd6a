"""Paged KV cache: per layer, K and V in preallocated tensors cut into fixed-size blocks.

The budget is explicit (a number of blocks). Which sequence holds which block is the
BlockManager's business; this module only holds the tensors.
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
