"""Rotary embeddings from a precomputed table.

transformers computes cos/sin every step with vectorized math whose rounding depends on
how many positions are in the batch, which makes a sequence's output depend on its
batch mates. A table computed once and indexed by position is batch-invariant (and
saves work every step).
"""

from __future__ import annotations

import torch


class RotaryTable(torch.nn.Module):
    def __init__(self, rotary: torch.nn.Module, max_positions: int, device: torch.device) -> None:
        super().__init__()
        positions = torch.arange(max_positions, device=device)[None, :]
        probe = torch.zeros(1, device=device, dtype=torch.float32)
        with torch.inference_mode():
            cos, sin = rotary(probe, positions)
        self.cos = cos[0].float()
        self.sin = sin[0].float()

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[position_ids].to(x.dtype), self.sin[position_ids].to(x.dtype)


def install_rotary_table(model: torch.nn.Module, max_positions: int, device: torch.device) -> bool:
    """Swap the model's rotary module for a table; False when the model has none we recognise."""
    base = getattr(model, "model", None)
    rotary = getattr(base, "rotary_emb", None)
    if rotary is None:
        return False
    base.rotary_emb = RotaryTable(rotary, max_positions, device)
    return True
