"""The paged attention alone: a prompt chunk after cached context (a prefix-cache hit) computes
bit for bit what the same rows got inside one causal pass over the whole prompt."""

from __future__ import annotations

import pytest
import torch

from engine_service.model import attention
from engine_service.model.kv_cache import CacheShape, KVCache

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK, Q_HEADS, KV_HEADS, DIM = 16, 9, 3, 64


class Layer(torch.nn.Module):
    layer_idx = 0


def attend(cache: KVCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int) -> torch.Tensor:
    """Positions first..first+n of one sequence (blocks 0, 1, ...), the earlier ones already cached."""
    n, context = q.shape[2], first + q.shape[2]
    table = torch.arange(-(-context // BLOCK))
    layout = attention.StepLayout(cache=cache, slot_mapping=torch.arange(first, context), num_decode=0,
                                  decode_block_ids=None, decode_lens=None, max_decode_context=0,
                                  prefills=[attention.PrefillChunk(0, n, context, table)])
    out, _ = attention.paged_attention(Layer(), q, k, v, None, scaling=DIM ** -0.5, layout=layout)
    return out


@pytest.mark.parametrize("length", [130, 178, 179, 263])
@pytest.mark.parametrize("left", [1, 2, 3, 6, 13])
def test_a_chunk_after_cached_context_matches_the_causal_pass(length: int, left: int) -> None:
    torch.manual_seed(length * 100 + left)
    q = torch.randn(1, Q_HEADS, length, DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(1, KV_HEADS, length, DIM, dtype=torch.bfloat16) for _ in range(2))
    cache = KVCache(CacheShape(1, KV_HEADS, DIM, BLOCK, 32), torch.bfloat16, torch.device("cpu"))
    cold = attend(cache, q, k, v, first=0)  # the whole prompt at once; fills the cache
    cached = length - left
    warm = attend(cache, q[:, :, cached:], k[:, :, cached:], v[:, :, cached:], first=cached)
    assert torch.equal(warm, cold[:, cached:])
