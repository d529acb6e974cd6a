"""Tiny random-weight models in memory, for the ModelRunner tests (no download, no tokenizer).

transformers is imported when a model or config is made, not with this module: the fast tier's
modules import it, and only the worker that runs them then pays the ~2.5 s import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# A small vocabulary keeps these fast; no tokenizer is needed.
RUNNER_COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     initializer_range=0.2)


def tiny_config(family: str = "llama", **extra: object) -> PretrainedConfig:
    """RUNNER_COMMON's config of `family` ("llama" or "qwen2"), with `extra` fields."""
    from transformers import LlamaConfig, Qwen2Config

    return {"llama": LlamaConfig, "qwen2": Qwen2Config}[family](**RUNNER_COMMON, **extra)


def tiny_in_memory(config: PretrainedConfig, dtype: torch.dtype) -> torch.nn.Module:
    """A seeded random model; its norms' weights random too (transformers starts them at one)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
    return model


@dataclass
class RunnerRequest:
    """The field of a Request that ScheduledBatch.step_input reads: its LoRA adapter's slot."""

    adapter_slot: int = 0


@dataclass
class RunnerSeq:
    """The fields of a Sequence that ScheduledBatch.step_input reads for the ModelRunner."""

    seq_id: int
    token_ids: list[int]
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)
    request: RunnerRequest = field(default_factory=RunnerRequest)
