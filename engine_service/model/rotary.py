"""Rotary embeddings from precomputed tables.

transformers computes cos/sin every step with vectorized math whose rounding depends on
how many positions are in the batch, which makes a sequence's output depend on its
batch mates. A table computed once and indexed by position is batch-invariant (and
saves work every step). Models with one rotary embedding per layer type (Gemma 3: local
and global bases) get one table per type; the model's own rotary module computes every
table, so scaling types (linear, yarn, llama3, ...) come out as transformers defines them.
"""

from __future__ import annotations

import torch

from engine_service.model.attention import UnsupportedModel

# Rope types whose frequencies switch once a sequence grows past a length (transformers'
# dynamic_rope_update): a table matches them only below that length.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


class RotaryTable(torch.nn.Module):
    def __init__(self, rotary: torch.nn.Module, max_positions: int, device: torch.device) -> None:
        super().__init__()
        positions = torch.arange(max_positions, device=device)[None, :]
        probe = torch.zeros(1, device=device, dtype=torch.float32)
        self.tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.inference_mode():
            for layer_type in _layer_types(rotary):
                _check_rope_type(rotary, layer_type, max_positions)
                args = () if layer_type is None else (layer_type,)
                cos, sin = rotary(probe, positions, *args)
                self.tables[layer_type] = (cos[0].float(), sin[0].float())

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.tables[layer_type]
        return cos[position_ids].to(x.dtype), sin[position_ids].to(x.dtype)


def _layer_types(rotary: torch.nn.Module) -> list[str | None]:
    """The layer types the module takes (a dict of rope types, one per type), or [None] for one table."""
    rope_type = getattr(rotary, "rope_type", None)
    return list(rope_type) if isinstance(rope_type, dict) else [None]


def _check_rope_type(rotary: torch.nn.Module, layer_type: str | None, max_positions: int) -> None:
    rope_type = getattr(rotary, "rope_type", "default")
    if layer_type is not None:
        rope_type = rope_type[layer_type]
    if not any(kind in rope_type for kind in LENGTH_DEPENDENT_ROPE):
        return
    params = rotary.config.rope_parameters
    params = params if layer_type is None else params[layer_type]
    limit = params.get("original_max_position_embeddings") or rotary.original_max_seq_len
    if max_positions > limit:
        raise UnsupportedModel(
            f"rope_type {rope_type!r} changes its frequencies once a sequence passes {limit} positions, which "
            f"the engine's rotary table cannot follow: serve it with --max-model-len {limit} (or less)")


def install_rotary_table(model: torch.nn.Module, max_positions: int, device: torch.device) -> bool:
    """Swap the model's rotary module for tables; False when the model has none we recognise."""
    base = getattr(model, "model", None)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        return False
    base.rotary_emb = RotaryTable(rotary, max_positions, device)
    return True
