"""LoRA adapters in PEFT's format, read and checked, and their low-rank weights handed to the linears.

An adapter is a folder with `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, `use_rslora`) and
`adapter_model.safetensors` (`base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight`
[out, r]). The linear's output for a row of that adapter gains scale * B(A x), scale = lora_alpha / r
(rsLoRA: lora_alpha / sqrt(r)); the base weights stay as they are (bf16, int8, native kernels): the
low-rank path runs beside them, never a merged copy: per run of rows that share an adapter (RowGroups in
linear.py), or, for a step whose rows span several adapters, as two batched matmuls over the adapters'
pairs stacked (LoraPairs.stacked): a handful of torch calls a linear however many adapters the step holds,
where each run's own matmuls cost every linear ~5 calls more per adapter (~5 us each on the CPU). Where the lean Llama forward fused q/k/v (gate/up) into one linear, the adapter's pieces
become one pair: their A's stacked and their B's on a block diagonal, zeros where a piece is not
targeted. What PEFT can express and this does not compute is refused at load, naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
UNSUPPORTED_TARGETS = ("embed_tokens", "lm_head")


class AdapterError(ValueError):
    """The folder is not an adapter this engine can serve (the message names why)."""


@dataclass
class LoraWeights:
    """One adapter's low-rank pairs by module path (as in the base model, e.g.
    "model.layers.0.self_attn.q_proj"): (A [r, in], scale * B [out, r]) in float32."""

    path: str
    rank: int
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]


class LoraPairs(dict):
    """One linear's resident adapters, slot -> (A.T [in, r], (scale * B).T [r, out]); and the pairs of a set of
    slots stacked for batched matmuls, each rank padded with zeros to the largest (zero terms add nothing),
    kept until a step asks for another set or an adapter comes or goes."""

    def __init__(self) -> None:
        super().__init__()
        self._stacked: tuple[tuple[int, ...], tuple[torch.Tensor, torch.Tensor] | None] | None = None

    def __setitem__(self, slot: int, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._stacked = None
        super().__setitem__(slot, pair)

    def pop(self, slot: int, *default: object) -> object:
        self._stacked = None
        return super().pop(slot, *default)

    def stacked(self, slots: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(A's [S, in, r], B's [S, r, out]) of `slots` in order, zeros for a slot this linear has no pair of;
        None when it has none of them."""
        if self._stacked is None or self._stacked[0] != slots:
            pairs = [self.get(slot) for slot in slots]
            present = [pair for pair in pairs if pair is not None]
            stacks = None
            if present:
                (a0, b0), rank = present[0], max(a.shape[1] for a, _ in present)
                a_stack = a0.new_zeros(len(slots), a0.shape[0], rank)
                b_stack = b0.new_zeros(len(slots), rank, b0.shape[1])
                for index, pair in enumerate(pairs):
                    if pair is not None:
                        a_stack[index, :, :pair[0].shape[1]] = pair[0]
                        b_stack[index, :pair[1].shape[0]] = pair[1]
                stacks = (a_stack, b_stack)
            self._stacked = (slots, stacks)
        return self._stacked[1]


def read_adapter(folder: str | Path, shapes: dict[str, tuple[int, int]], max_rank: int) -> LoraWeights:
    """The adapter in `folder`, checked against the base model's linears, `shapes`: name -> (out, in)
    as transformers built them (before any fusing)."""
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise AdapterError(f"{folder} is not a PEFT LoRA adapter: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{config_path}: {exc}") from None
    rank, alpha = _check_config(config, max_rank)
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    from safetensors.torch import load_file

    tensors = load_file(str(weights_path))
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in sorted(tensors):
        if not key.endswith(".lora_A.weight"):
            if not key.endswith(".lora_B.weight"):
                raise AdapterError(f"{WEIGHTS_FILE}: unexpected tensor {key!r} (only lora_A/lora_B weights)")
            continue
        name = key.removeprefix(PREFIX).removesuffix(".lora_A.weight")
        a, b = tensors[key], tensors.get(f"{PREFIX}{name}.lora_B.weight")
        if b is None:
            raise AdapterError(f"{WEIGHTS_FILE}: {name} has lora_A but no lora_B")
        if name.rpartition(".")[2] in UNSUPPORTED_TARGETS:
            raise AdapterError(f"{WEIGHTS_FILE}: {name}: embedding and lm_head targets are not supported")
        if name not in shapes:
            raise AdapterError(f"{WEIGHTS_FILE}: {name} is not a linear layer of this base model")
        out_features, in_features = shapes[name]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise AdapterError(f"{name}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit this base "
                               f"model's {out_features}x{in_features} with r={rank}: an adapter for another base "
                               "model?")
        pairs[name] = (a.float(), b.float() * scale)
    if not pairs:
        raise AdapterError(f"{WEIGHTS_FILE} holds no LoRA weights")
    return LoraWeights(str(folder), rank, pairs)


def _check_config(config: dict, max_rank: int) -> tuple[int, float]:
    """(r, lora_alpha); AdapterError naming the field for what is not supported."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r}: only LORA adapters are served")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"r must be a positive integer, not {rank!r}")
    if rank > max_rank:
        raise AdapterError(f"r={rank} is above --max-lora-rank {max_rank}")
    if not isinstance(alpha, (int, float)):
        raise AdapterError(f"lora_alpha must be a number, not {alpha!r}")
    refused = {"use_dora": "DoRA adapters are not supported", "modules_to_save": "modules_to_save is not supported",
               "rank_pattern": "per-module ranks are not supported", "alpha_pattern": "per-module alphas are not supported",
               "fan_in_fan_out": "fan_in_fan_out (Conv1D layers) is not supported",
               "layers_to_transform": "layers_to_transform is not supported"}
    for field, why in refused.items():
        if config.get(field):
            raise AdapterError(f"{field}: {why}")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias {config.get('bias')!r}: only bias 'none' is supported")
    targets = config.get("target_modules") or []
    for target in [targets] if isinstance(targets, str) else targets:
        if any(part in target for part in UNSUPPORTED_TARGETS):
            raise AdapterError(f"target_modules {target!r}: embedding and lm_head targets are not supported")
    return rank, float(alpha)


def linear_pairs(model: torch.nn.Module, weights: LoraWeights, dtype: torch.dtype,
                 fused_parts: dict[str, list[tuple[str, int]]]) -> dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The adapter's (A.T [in, r], (scale * B).T [r, out]) for each linear of `model` as it runs (projections
    fused or not), contiguous in `dtype` (what the low-rank products compute in): `fused_parts` maps a fused
    linear's name ("qkv_proj") to its pieces and their output sizes."""
    out, used = {}, set()
    for name, module in model.named_modules():
        if getattr(module, "lora", None) is None:  # not a linear that takes adapters (or a linear's copy)
            continue
        parent, _, leaf = name.rpartition(".")
        parts = fused_parts.get(leaf, [(leaf, module.out_features)])
        pieces = [(weights.pairs.get(f"{parent}.{part}"), size) for part, size in parts]
        used.update(f"{parent}.{part}" for part, _ in parts)
        if all(pair is None for pair, _ in pieces):
            continue
        a_rows, b = [], torch.zeros(module.out_features, 0)
        row = 0
        for pair, size in pieces:  # A's stacked, B's on the block diagonal (untargeted pieces left out)
            if pair is not None:
                a_rows.append(pair[0])
                block = torch.zeros(module.out_features, weights.rank)
                block[row:row + size] = pair[1]
                b = torch.cat([b, block], dim=1)
            row += size
        out[module] = (torch.cat(a_rows).T.to(dtype).contiguous(), b.T.to(dtype).contiguous())
    missing = sorted(set(weights.pairs) - used)
    if missing:
        raise AdapterError(f"the adapter targets {missing[:3]}, which this engine does not run as its linears")
    return out
