"""Paged KV cache: per layer, K and V in preallocated tensors cut into fixed-size blocks.

The budget is explicit: a number of blocks, which `kv_cache_blocks` works out from the engine's
settings. Which sequence holds which block is the BlockManager's business; this module only
holds the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig


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


def kv_cache_blocks(model_config: PretrainedConfig, dtype: torch.dtype, block_size: int, max_model_len: int,
                     tokens: int = 0, gb: float = 0.0) -> int:
    """Blocks for a cache of `tokens` tokens, or (tokens 0) of as many as `gb` GiB hold, always
    room for one full-length sequence; plus one, the block the runner keeps for padding."""
    if not tokens:
        head_dim = (getattr(model_config, "head_dim", None)
                    or model_config.hidden_size // model_config.num_attention_heads)
        per_token = KVCache.bytes_per_token(model_config.num_hidden_layers, model_config.num_key_value_heads,
                                            head_dim, dtype)
        tokens = int(gb * (1 << 30)) // per_token
    tokens = max(tokens, max_model_len + block_size)
    return -(-tokens // block_size) + 1
