"""PEFT LoRA adapters written by the tests with safetensors alone (no peft): seeded low-rank pairs for
some of a base model's linears, and the base model with an adapter merged (W + scale * B @ A), as
PEFT's merge_and_unload makes it, for reference."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_adapter(folder: Path, model: torch.nn.Module, targets: tuple[str, ...], rank: int, alpha: float,
                  seed: int, magnitude: float = 0.5, rslora: bool = False) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """An adapter for every linear of `model` whose name ends with one of `targets`; its pairs by module name."""
    generator = torch.Generator().manual_seed(seed)
    pairs, tensors = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in targets:
            a = torch.randn(rank, module.in_features, generator=generator) * magnitude
            b = torch.randn(module.out_features, rank, generator=generator) * magnitude
            pairs[name] = (a, b)
            tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
        "use_rslora": rslora, "use_dora": False, "base_model_name_or_path": "tiny"}))
    return pairs


def merged(model: torch.nn.Module, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.nn.Module:
    """A copy of `model` with each pair merged into its linear's weights."""
    copied = copy.deepcopy(model)
    modules = dict(copied.named_modules())
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            linear = modules[name]
            linear.weight += (scale * (b @ a)).to(linear.weight.dtype)
    return copied


def scale_of(rank: int, alpha: float, rslora: bool = False) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


# The default model's (SmolLM2-135M-Instruct) linears by name: (out, in) per layer. An adapter for it can be
# written without loading it (write_shaped_adapter): the tests that load adapters at run time need no torch.
DEFAULT_MODEL_LAYERS = 30
DEFAULT_MODEL_LINEARS = {"q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "o_proj": (576, 576),
                         "gate_proj": (1536, 576), "up_proj": (1536, 576), "down_proj": (576, 1536)}
_MODULE_OF = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_shaped_adapter(folder: Path, targets: tuple[str, ...], rank: int, alpha: float, seed: int,
                         magnitude: float = 0.05, layers: int = DEFAULT_MODEL_LAYERS,
                         linears: dict[str, tuple[int, int]] = DEFAULT_MODEL_LINEARS) -> Path:
    """A PEFT adapter (numpy and safetensors alone) for the `targets` of a Llama model of these shapes
    (the default model's unless told); `folder`."""
    import numpy as np
    from safetensors.numpy import save_file as save_numpy

    generator = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for target in targets:
            out_features, in_features = linears[target]
            name = f"base_model.model.model.layers.{layer}.{_MODULE_OF[target]}.{target}"
            tensors[f"{name}.lora_A.weight"] = (generator.standard_normal((rank, in_features)) * magnitude
                                                ).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = (generator.standard_normal((out_features, rank)) * magnitude
                                                ).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_numpy(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    return folder
