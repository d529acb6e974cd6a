"""CPU linear layers: oneDNN-prepacked full weights, or int8 / 4-bit weights on torch's own kernels.

torch's plain CPU linear re-lays out the weight on every call; prepacking it once for oneDNN
makes bf16 decode-sized matmuls (a few rows) about 2x faster here, with the same results.

A decode step at a small batch is bound by streaming the weights from memory, so smaller weights
are faster: `_weight_int8pack_mm` (int8, one scale per output channel) and
`_weight_int4pack_mm_for_cpu` (4-bit, groups of 32 inputs with a scale and a zero each; the
default model's GGUF weights are Q4_1, which this layout holds up to scale rounding). Both
kernels give each row the same result whatever the number of rows. Past a few rows the 4-bit
kernel is slower than oneDNN's bf16 GEMM, so an Int4Linear may also keep a bf16 copy of its
dequantized weights (the same values) for steps with many rows; that switch changes rounding
with the batch size, which `deterministic` forbids. Figures: benchmarks/RESULTS.md, "Step time
and low-bit weights (issue 11)". On other devices the model is left as it is.
"""

from __future__ import annotations

import torch

QUANTIZATIONS = ("none", "int8", "int4")
# The default for bf16 on the CPU. int4 makes a decode step at batch <= 8 about 2x faster, but it
# moves greedy outputs (about 1 token in 8 differs from bf16 on a fixed prompt set, and the tests'
# reference answer to "What is the capital of France?" changes), so the default stays the weights the
# model came with until the suite's expected outputs are re-baselined; see benchmarks/RESULTS.md.
CPU_BF16_DEFAULT = "none"
INT4_GROUP = 32
# Rows (tokens in a step) above which an Int4Linear uses its bf16 copy, unless deterministic.
INT4_MAX_ROWS = 8


def resolve_quantization(requested: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The weights choice: as asked, else the default, which applies only to bf16 on the CPU."""
    if requested is None:
        return CPU_BF16_DEFAULT if device.type == "cpu" and dtype == torch.bfloat16 else "none"
    if requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {requested!r}")
    if requested != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {requested} runs on the CPU only; use --quantization none on {device}")
    return requested


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


class PackedLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int = 32) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = torch.nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class Int8Linear(torch.nn.Module):
    """Symmetric int8 weights with one scale per output channel."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.register_buffer("weight", torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(_flat(x), self.weight, self.scales).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def int4_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] weights -> (4-bit codes [N, K] int32, scales [N, K/32], zeros [N, K/32]) with
    w ~= (code - 8) * scale + zero; scales and zeros are rounded to the weight's dtype first, so
    the codes are chosen for the values the kernel will use."""
    n, k = weight.shape
    w = weight.detach().float().view(n, k // INT4_GROUP, INT4_GROUP)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=1e-12).to(weight.dtype).float()
    zeros = (low + 8 * scales).to(weight.dtype).float()
    codes = torch.round((w - zeros[..., None]) / scales[..., None] + 8).clamp(0, 15).to(torch.int32)
    return codes.view(n, k), scales, zeros


class Int4Linear(torch.nn.Module):
    """4-bit weights, groups of 32 inputs with a scale and a zero each (asymmetric). With
    `max_rows`, inputs of more rows go through a oneDNN-packed copy of the dequantized weights."""

    def __init__(self, linear: torch.nn.Linear, max_rows: int | None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        codes, scales, zeros = int4_quantize(weight)
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("scales_and_zeros",
                             torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(weight.dtype))
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.max_rows = max_rows
        self.full: PackedLinear | None = None
        if max_rows is not None:
            n, k = weight.shape
            dequantized = (codes.view(n, -1, INT4_GROUP) - 8) * scales[..., None] + zeros[..., None]
            self.full = PackedLinear(dequantized.view(n, k).to(weight.dtype), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = _flat(x)
        if self.full is not None and rows.shape[0] > self.max_rows:
            return self.full(x)
        y = torch._weight_int4pack_mm_for_cpu(rows, self.packed, INT4_GROUP, self.scales_and_zeros)
        y = y.view(*x.shape[:-1], self.out_features)  # not -1: a step may keep no rows
        return y if self.bias is None else y + self.bias


def _replacement(linear: torch.nn.Linear, quantization: str, deterministic: bool) -> torch.nn.Module:
    if quantization == "int8":
        return Int8Linear(linear)
    if quantization == "int4" and linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0:
        return Int4Linear(linear, None if deterministic else INT4_MAX_ROWS)
    return PackedLinear(linear.weight, linear.bias)


def quantize_linears(model: torch.nn.Module, quantization: str, deterministic: bool) -> int:
    """Swap every CPU nn.Linear (the tied lm_head too: the embedding keeps its own weights) for the
    chosen kind; returns how many. int4 needs in_features % 32 == 0 and out_features % 16 == 0; other
    layers keep full weights. A no-op without oneDNN or off the CPU."""
    if not torch.backends.mkldnn.is_available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.device.type == "cpu":
                setattr(parent, name, _replacement(child, quantization, deterministic))
                swapped += 1
    return swapped
