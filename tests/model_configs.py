"""Tiny random-weight decoders of several transformers families, built from configs (no download).

Each is saved to a folder with the default model's tokenizer, so the engine loads it like any
model folder. Weights are drawn with a fixed seed and a large init range, so greedy choices are
decided by clear margins rather than by float rounding.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig, Phi3Config,
                          PretrainedConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen3Config)

SLIDING_WINDOW = 16  # for the families that have one; the tests' long prompts are longer
LONGROPE_SWITCH = 64  # LONGROPE_PHI3 switches to its long rope factors past this many positions

_COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
               initializer_range=0.2)

TINY_CONFIGS: dict[str, PretrainedConfig] = {
    "llama": LlamaConfig(**_COMMON, attention_bias=True, mlp_bias=True),  # the engine's lean forward, biases
    "qwen2": Qwen2Config(**_COMMON),  # q/k/v biases
    "qwen3": Qwen3Config(**_COMMON, head_dim=16),  # QK norms
    "mistral": MistralConfig(**_COMMON, sliding_window=SLIDING_WINDOW),  # every layer sliding
    "phi3": Phi3Config(**_COMMON, pad_token_id=0),  # fused qkv and gate_up projections
    # sliding and full layers alternating, attention logit soft cap, query_pre_attn_scalar scaling
    "gemma2": Gemma2Config(**_COMMON, head_dim=16, sliding_window=SLIDING_WINDOW, query_pre_attn_scalar=24),
}

# Phi-3 with "longrope" (as Phi-3-mini-128k): its rotary frequencies depend on the sequence's length.
LONGROPE_PHI3 = Phi3Config(**_COMMON, pad_token_id=0, original_max_position_embeddings=LONGROPE_SWITCH,
                           rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                            "short_factor": [1.0 + i / 8 for i in range(8)],
                                            "long_factor": [4.0 + i for i in range(8)]})


def build_tiny_model(config: PretrainedConfig, folder: Path, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save a seeded random model of `config` with `tokenizer` into `folder`."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
