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
