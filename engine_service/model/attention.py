"""Paged attention for transformers models, plugged in through its AttentionInterface.

Every step runs as ONE packed sequence of shape [1, T]: first one token per decoding
sequence, then the prompt chunks being prefilled. The model computes q/k/v and rotary
embeddings as usual (position_ids carry each token's true position); this function
writes the new k/v into the paged cache and attends each token to its own sequence's
cached context only. Any transformers decoder that uses the attention interface works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from engine_service.model.kv_cache import KVCache

ATTENTION_NAME = "conduit_paged"


@dataclass
class PrefillChunk:
    start: int  # first token of the chunk in the packed batch
    length: int
    context_len: int  # cached tokens after this chunk, chunk included
    block_table: torch.Tensor  # [num_blocks] block ids
    mask: torch.Tensor | None  # [length, context_len] bool; None when the chunk is the whole context


@dataclass
class StepLayout:
    """Where each packed token lives; built once per step, read by every layer."""

    cache: KVCache
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    num_decode: int
    decode_block_tables: torch.Tensor | None  # [num_decode, max_blocks]
    decode_mask: torch.Tensor | None  # [num_decode, 1, 1, max_context] bool
    max_decode_context: int
    prefills: list[PrefillChunk]


def _gather(cache_layer: torch.Tensor, block_tables: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """[B, max_blocks] block ids -> [B, kv_heads, length, head_dim] cached tensors."""
    num_slots, heads, dim = cache_layer.shape
    # Whole blocks as flat rows: index_select copies each block as one contiguous run.
    blocks = cache_layer.view(num_slots // block_size, -1).index_select(0, block_tables.flatten())
    batch = block_tables.shape[0]
    return blocks.view(batch, -1, heads, dim)[:, :length].transpose(1, 2)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    layout: StepLayout | None = None, **_: object) -> tuple[torch.Tensor, None]:
    assert layout is not None, "the conduit_paged attention needs a StepLayout (layout=...)"
    cache = layout.cache
    block_size = cache.shape.block_size
    k_cache = cache.keys[module.layer_idx]
    v_cache = cache.values[module.layer_idx]
    # query [1, Hq, T, D]; key/value [1, Hkv, T, D]
    _, q_heads, num_tokens, head_dim = query.shape
    kv_heads = key.shape[1]
    k_cache.index_copy_(0, layout.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, layout.slot_mapping, value[0].transpose(0, 1))

    out = query.new_empty(num_tokens, q_heads, head_dim)
    nd = layout.num_decode
    if nd:
        # One query per sequence: fold the query heads that share a kv head into the
        # "length" axis, so grouped-query attention needs no repeated k/v.
        group = q_heads // kv_heads
        q = query[0, :, :nd].transpose(0, 1).reshape(nd, kv_heads, group, head_dim)
        k = _gather(k_cache, layout.decode_block_tables, block_size, layout.max_decode_context)
        v = _gather(v_cache, layout.decode_block_tables, block_size, layout.max_decode_context)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.decode_mask, scale=scaling)
        out[:nd] = o.reshape(nd, q_heads, head_dim)
    for chunk in layout.prefills:
        s, n = chunk.start, chunk.length
        q = query[:, :, s:s + n]
        if chunk.mask is None:
            k, v = key[:, :, s:s + n], value[:, :, s:s + n]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        else:
            table = chunk.block_table.unsqueeze(0)
            k = _gather(k_cache, table, block_size, chunk.context_len)
            v = _gather(v_cache, table, block_size, chunk.context_len)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.mask, scale=scaling, enable_gqa=True)
        out[s:s + n] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def _no_mask(*args: object, **kwargs: object) -> None:
    """The packed layout carries its own masks; transformers must not build one."""
    return None


def register() -> str:
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
