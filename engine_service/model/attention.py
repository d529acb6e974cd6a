"""Paged attention for transformers models, plugged in through its AttentionInterface.

Every step runs as ONE packed sequence of shape [1, T]: first one token per decoding
sequence, then the prompt segments being prefilled (model/step.py: each attends with a call of its
own, shaped by the segment alone, so it computes alike whether its prompt was cached or not). The
model computes q/k/v, QK norms and
rotary embeddings with its own modules (position_ids carry each token's true position);
this function writes the new k/v into the paged cache and attends each token to its own
sequence's cached context only, as the layer asks: its `scaling`, its `sliding_window`
(the token and the W - 1 before it, as transformers' sliding_window_overlay) and its
`softcap`. What it cannot honour it refuses (UnsupportedModel), at engine start where the
config tells (check_supported), never with different output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine_service.model.kv_cache import KVCache
from engine_service.model.step import StepGaveWay


ATTENTION_NAME = "conduit_paged"
LAYER_TYPES = ("full_attention", "sliding_attention")  # config.layer_types this attention serves


class UnsupportedModel(ValueError):
    """The model needs an attention (or rotary) feature the engine does not implement."""


@dataclass
class PrefillChunk:
    """A prompt segment (or any run of one sequence's prompt tokens) computed this step."""

    start: int  # first token of the chunk in the packed batch
    length: int
    context_len: int  # cached tokens after this chunk, chunk included
    block_table: torch.Tensor  # [num_blocks] block ids

    @property
    def first(self) -> int:
        """Position of the chunk's first token in its sequence."""
        return self.context_len - self.length


@dataclass
class StepLayout:
    """Where each packed token lives; built once per step, read by every layer."""

    cache: KVCache
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    num_decode: int
    decode_block_ids: torch.Tensor | None  # [num_decode * max_blocks]: the block tables, flat
    decode_lens: torch.Tensor | None  # [num_decode] context length of each decode row, its token included
    max_decode_context: int  # whole blocks
    prefills: list[PrefillChunk]
    masks: dict[tuple, torch.Tensor] = field(default_factory=dict)  # built once per step, shared by layers
    # Attends the decode rows in place in the cache (model/native.py's decode_attention op), for a
    # model it supports (the runner checks); None: gather, then SDPA.
    decode_kernel: Callable[..., torch.Tensor] | None = None
    # Asked at each layer's attention: True stops the step there (StepGaveWay). None: the step runs whole.
    give_way: Callable[[], bool] | None = None

    def decode_mask(self, window: int | None) -> torch.Tensor:
        """[num_decode, 1, 1, max_decode_context]: each row's own context (its last `window` tokens)."""
        key = ("decode", window)
        if key not in self.masks:
            device = self.decode_lens.device
            keys = torch.arange(self.max_decode_context, device=device)
            self.masks[key] = causal_mask(self.decode_lens - 1, keys, window)[:, None, None, :]
        return self.masks[key]

    def chunk_mask(self, index: int, first_key: int, window: int | None) -> torch.Tensor:
        """[length, context - first_key]: the chunk's tokens over its context from position `first_key`."""
        key = ("chunk", index, first_key, window)
        if key not in self.masks:
            chunk = self.prefills[index]
            device = chunk.block_table.device
            queries = torch.arange(chunk.first, chunk.context_len, device=device)
            keys = torch.arange(first_key, chunk.context_len, device=device)
            self.masks[key] = causal_mask(queries, keys, window)
        return self.masks[key]


def causal_mask(queries: torch.Tensor, keys: torch.Tensor, window: int | None) -> torch.Tensor:
    """[Q, K] bool from positions: each query sees keys at or before it, and within `window` of it."""
    mask = keys[None, :] <= queries[:, None]
    if window is not None:
        mask &= keys[None, :] > queries[:, None] - window
    return mask


def _gather(cache_layer: torch.Tensor, block_ids: torch.Tensor, batch: int, block_size: int,
            length: int) -> torch.Tensor:
    """Flat block ids of `batch` equally long block tables -> [B, kv_heads, length, head_dim] cached tensors."""
    num_slots, heads, dim = cache_layer.shape
    # Whole blocks as flat rows: index_select copies each block as one contiguous run.
    blocks = cache_layer.view(num_slots // block_size, -1).index_select(0, block_ids)
    return blocks.view(batch, -1, heads, dim)[:, :length].transpose(1, 2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            scaling: float | None, softcap: float | None) -> torch.Tensor:
    """Attention over [B, H, L, D] tensors (k/v may have fewer heads); mask None means causal."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling,
                                              enable_gqa=True)
    # SDPA has no soft cap: transformers' eager attention, written out.
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    sliding_window: int | None = None, softcap: float | None = None,
                    layout: StepLayout | None = None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [1, Hq, T, D], key/value [1, Hkv, T, D] -> [1, T, Hq, D]."""
    assert layout is not None, "the conduit_paged attention needs a StepLayout (layout=...)"
    _refuse_unsupported(kwargs)
    out = attend_packed(module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1),
                        value[0].transpose(0, 1), layout, scaling, sliding_window, softcap)
    return out.unsqueeze(0), None


def attend_packed(layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: StepLayout,
                  scaling: float | None, sliding_window: int | None = None,
                  softcap: float | None = None) -> torch.Tensor:
    """The step's packed tokens, query [T, Hq, D] and key/value [T, Hkv, D] (views of any strides):
    writes the new k/v into the cache and returns the attention output [T, Hq, D]."""
    if layout.give_way is not None and layout.give_way():
        raise StepGaveWay(f"gave way at layer {layer_idx}")
    cache = layout.cache
    block_size = cache.shape.block_size
    k_cache = cache.keys[layer_idx]
    v_cache = cache.values[layer_idx]
    num_tokens, q_heads, head_dim = query.shape
    k_cache.index_copy_(0, layout.slot_mapping, key)
    v_cache.index_copy_(0, layout.slot_mapping, value)

    nd = layout.num_decode
    decoded = _attend_decode_rows(query[:nd], k_cache, v_cache, layout, scaling, sliding_window, softcap) if nd else None
    if decoded is not None and nd == num_tokens:
        return decoded
    out = query.new_empty(num_tokens, q_heads, head_dim)
    if decoded is not None:
        out[:nd] = decoded
    for index, chunk in enumerate(layout.prefills):
        s, n = chunk.start, chunk.length
        q = query[s:s + n].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        if not chunk.first:  # the whole context is this chunk
            k, v = key[s:s + n].transpose(0, 1).unsqueeze(0), value[s:s + n].transpose(0, 1).unsqueeze(0)
            in_window = sliding_window is None or n <= sliding_window
            mask = None if in_window else layout.chunk_mask(index, 0, sliding_window)
        else:
            # Earlier chunks are in the cache; a sliding layer reads only the blocks its window reaches.
            first_block = 0 if sliding_window is None else max(0, chunk.first - sliding_window + 1) // block_size
            table = chunk.block_table[first_block:]
            first_key = first_block * block_size
            k = _gather(k_cache, table, 1, block_size, chunk.context_len - first_key)
            v = _gather(v_cache, table, 1, block_size, chunk.context_len - first_key)
            mask = layout.chunk_mask(index, first_key, sliding_window)
        o = _attend(q, k, v, mask, scaling, softcap)
        out[s:s + n] = o[0].transpose(0, 1)
    return out


def _attend_decode_rows(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: StepLayout,
                        scaling: float | None, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """The decode rows' queries [nd, Hq, D], one per sequence, over their cached contexts -> [nd, Hq, D]."""
    nd, q_heads, head_dim = query.shape
    block_size = layout.cache.shape.block_size
    kernel = layout.decode_kernel
    if kernel is not None and softcap is None:
        return kernel(query, k_cache, v_cache, layout.decode_block_ids, layout.decode_lens, block_size,
                      sliding_window or 0, head_dim ** -0.5 if scaling is None else scaling)
    # Gathered, then SDPA. The query heads that share a kv head are folded into the "length" axis,
    # so grouped-query attention needs no repeated k/v.
    kv_heads = k_cache.shape[1]
    q = query.reshape(nd, kv_heads, q_heads // kv_heads, head_dim)
    ids, length = layout.decode_block_ids, layout.max_decode_context
    k = _gather(k_cache, ids, nd, block_size, length)
    v = _gather(v_cache, ids, nd, block_size, length)
    return _attend(q, k, v, layout.decode_mask(sliding_window), scaling, softcap).reshape(nd, q_heads, head_dim)


def _refuse_unsupported(kwargs: dict[str, object]) -> None:
    """Attention features a layer may ask for that this function does not compute."""
    if kwargs.get("is_causal") is False:
        raise UnsupportedModel("the model asks for bidirectional attention (is_causal=False)")
    for name in ("s_aux", "sinks", "position_bias"):
        if kwargs.get(name) is not None:
            raise UnsupportedModel(f"the model's attention passes {name!r}, which the paged attention does not apply")


def check_supported(model: torch.nn.Module) -> None:
    """Refuse, at start, a model whose config asks for attention this module does not implement."""
    config = model.config
    name = type(model).__name__
    if not getattr(model, "_supports_attention_backend", False):
        raise UnsupportedModel(f"{name} does not route attention through transformers' attention interface")
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModel(f"{name} is configured for bidirectional attention (use_bidirectional_attention)")
    unknown = sorted(set(getattr(config, "layer_types", None) or ()) - set(LAYER_TYPES))
    if unknown:
        raise UnsupportedModel(f"{name} has layer types {unknown}; the engine serves only {list(LAYER_TYPES)}")
    if any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in model.modules()):
        raise UnsupportedModel(f"{name} uses attention sinks, which the paged attention does not apply")


def _no_mask(*args: object, **kwargs: object) -> None:
    """The packed layout carries its own masks; transformers must not build one."""
    return None


def register() -> str:
    # Imported here, when a model is set up: importing transformers takes ~2.5 s that the tests which
    # load no model (the fast tier) need not pay.
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
