"""CPU linear layers: oneDNN-prepacked full weights, int8 weights (our native kernel, or torch's), or
4-bit weights on torch's kernel.

torch's plain CPU linear re-lays out the weight on every call; prepacking it once for oneDNN
makes bf16 decode-sized matmuls (a few rows) about 2x faster here, with the same results.

A decode step at a small batch is bound by streaming the weights from memory, so smaller weights
are faster: int8 with one scale per output channel (model/native.py's kernel, which streams the
weights ~1.5x faster, where it builds; else torch's `_weight_int8pack_mm`) and
`_weight_int4pack_mm_for_cpu` (4-bit, groups of 32 inputs with a scale and a zero each; the
default model's GGUF weights are Q4_1, which this layout holds up to scale rounding). These
kernels give each row the same result whatever the number of rows. Past a few rows they are slower
than oneDNN's bf16 GEMM, so a low-bit linear may also keep a bf16 copy of its dequantized weights
(the same values, rounded to bf16), which runs instead for groups of many decode rows and
for prompt segments; that changes rounding with the batch, which `deterministic` forbids. Every CPU linear
computes the step's row groups (RowGroups) with calls of their own. Figures:
benchmarks/RESULTS.md, "Step time and low-bit weights (issue 11)" and "int8 weights by default".
On other devices the model is left as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from collections.abc import Callable

from engine_service.model.lora import LoraPairs
from engine_service.model.native import Kernels
from engine_service.model.weight_formats import QUANTIZATIONS

# The default for bf16 on the CPU. int8 makes a decode step at batch <= 8 about 1.4x faster and
# keeps greedy outputs close to bf16 (about 1 token in 16 differs on a fixed prompt set; the tests'
# reference answers hold). int4 is faster still but changes answers ("What is the capital of France?"
# gets "L'Étoile ..."), so it is only on request. With `deterministic` the default is the model's own
# weights: oneDNN's bf16 kernels are batch-invariant at every batch size, where int8 would need its
# slower kernel past LOW_BIT_MAX_ROWS.
CPU_BF16_DEFAULT = "int8"
INT4_GROUP = 32
# Decode rows (tokens in a step) above which low-bit linears use their bf16 copies, unless deterministic.
LOW_BIT_MAX_ROWS = 8
# The same where oneDNN has no bf16 GEMM (an AVX2-only CPU: the copies compute in float32) and int8
# runs on the native kernel, which stays faster there at every batch measured, 8-64 rows: batch 16
# 60 against 89 ms a step, 32 112 against 122, 64 235 against 252 (benchmarks/RESULTS.md).
NATIVE_INT8_MAX_ROWS_WITHOUT_BF16_GEMM = 64


def low_bit_max_rows(dtype: torch.dtype, native_int8: Kernels | None) -> int:
    """Decode rows up to which the low-bit kernel beats the full copy's GEMM for this dtype."""
    return NATIVE_INT8_MAX_ROWS_WITHOUT_BF16_GEMM if native_int8 is not None and not packable(dtype) else LOW_BIT_MAX_ROWS


class RowGroups:
    """A step's rows in the groups that every CPU linear sharing this object computes with calls of
    their own, set once per step by the model runner: the decode rows, then each prompt segment
    (model/step.py). A dense kernel may round a row by the number of rows in its call (oneDNN's AMX
    kernels block by it, and one row takes a GEMV path everywhere); a segment's call has the same
    shape whether its prompt was cached or not and whatever else the step holds, so it rounds alike.

    `full` says per group whether low-bit linears run their full (bf16) copy: for prompt segments,
    and for more than `low_bit_max_rows` decode rows, where oneDNN's GEMM is faster. None: never
    (deterministic: the low-bit kernel for every row, no copies kept). `runs` are the rows of a LoRA
    adapter (model/lora.py), each run within one group: one low-rank matmul pair per run. Decode rows of
    several adapters take one batched pair for them all instead (`stacked_runs`), unless deterministic: its
    padding makes a row's rounding depend on the others, as the full copies do. A prompt segment's runs never
    do: it computes alike whatever else the step holds (model/step.py)."""

    def __init__(self, low_bit_max_rows: int | None = LOW_BIT_MAX_ROWS) -> None:
        self.low_bit_max_rows = low_bit_max_rows
        self.bounds = [0]  # group i is rows bounds[i]:bounds[i + 1]
        self.full: list[bool] = []
        self.runs: list[tuple[int, int, int]] = []  # (first row, end row, adapter slot)
        self.stacked_runs: StackedRuns | None = None  # where the runs span several adapters

    @property
    def keeps_full_copies(self) -> bool:
        return self.low_bit_max_rows is not None

    def set_for_step(self, groups: list[tuple[int, bool]], runs: list[tuple[int, int, int]] = ()) -> None:
        """The step's groups in row order, as (rows, is a prompt segment), empty ones dropped; and the
        runs of rows with an adapter, as (first row, end row, adapter slot)."""
        self.bounds, self.full, self.runs, self.stacked_runs = [0], [], list(runs), None
        for rows, prompt in groups:
            if rows:
                self.bounds.append(self.bounds[-1] + rows)
                self.full.append(self.keeps_full_copies and (prompt or rows > self.low_bit_max_rows))
        decode_rows = groups[0][0] if groups and not groups[0][1] else 0
        decode_runs = [run for run in self.runs if run[1] <= decode_rows]
        if self.keeps_full_copies and len({slot for _, _, slot in decode_runs}) > 1:
            self.stacked_runs = StackedRuns(decode_runs, self.bounds[-1])
            self.runs = self.runs[len(decode_runs):]  # (the decode rows come first)

    def apply(self, compute: Callable[[torch.Tensor, bool], torch.Tensor], rows: torch.Tensor,
              lora: LoraPairs | None = None) -> torch.Tensor:
        """compute(group's rows, full) over each group, joined, plus each adapter run's low-rank part
        from `lora` (slot -> (A.T, (scale * B).T), model/lora.py), computed in the pair's dtype; [rows, features]
        in and out. Rows that are not the step's (a model's layer over some of them) go in one call, and cannot
        take an adapter."""
        planned = rows.shape[0] == self.bounds[-1]
        if len(self.full) < 2 or not planned:
            out = compute(rows, any(self.full))
        else:
            out = torch.cat([compute(rows[a:b], full) for a, b, full in zip(self.bounds, self.bounds[1:], self.full)])
        if lora and (self.runs or self.stacked_runs):
            if not planned:
                raise RuntimeError("a LoRA adapter on a layer that computes part of the step's rows")
            if self.stacked_runs is not None:
                self.stacked_runs.add_to(out, rows, lora)
            wide = None  # the rows in the pairs' dtype, converted once for every run
            for first, end, slot in self.runs:
                if (pair := lora.get(slot)) is not None:
                    a_t, b_t = pair
                    wide = rows.to(a_t.dtype) if wide is None else wide
                    out[first:end] += (wide[first:end] @ a_t) @ b_t  # added in the pairs' dtype, rounded once
        return out


class StackedRuns:
    """A step's adapter rows laid out for batched matmuls (LoraPairs.stacked): entry i holds the rows of
    slots[i] in row order, padded to the longest entry's `length`; `gather` picks each place's row (padding:
    row 0, whose products are never read back) and `back` each row's place in the flat result, or one past it
    (a zero row) for a row of the base model. Where the places are rows first..first + places in order (rows
    sorted by adapter, as many of each: the common case), neither index is needed."""

    def __init__(self, runs: list[tuple[int, int, int]], num_rows: int) -> None:
        by_slot: dict[int, list[int]] = {}
        for first, end, slot in runs:
            by_slot.setdefault(slot, []).extend(range(first, end))
        self.slots = tuple(sorted(by_slot))
        self.length = max(map(len, by_slot.values()))
        places = len(self.slots) * self.length
        gather, back = [0] * places, [places] * num_rows
        for index, slot in enumerate(self.slots):
            for offset, row in enumerate(by_slot[slot]):
                gather[index * self.length + offset] = row
                back[row] = index * self.length + offset
        in_order = gather == list(range(gather[0], gather[0] + places))
        self.first = gather[0] if in_order else None
        self._indices = {} if in_order else {"cpu": (torch.tensor(gather), torch.tensor(back))}

    def add_to(self, out: torch.Tensor, rows: torch.Tensor, lora: LoraPairs) -> None:
        """Adds to `out` [rows, out] each row's adapter's scale * B(A x), computed in the pairs' dtype and
        rounded once into out's."""
        stacks = lora.stacked(self.slots)
        if stacks is None:
            return
        a, b = stacks
        if self.first is not None:
            end = self.first + len(self.slots) * self.length
            x = rows[self.first:end].to(a.dtype).view(len(self.slots), self.length, -1)
            out[self.first:end] += torch.bmm(torch.bmm(x, a), b).view(end - self.first, -1)
            return
        device = rows.device.type
        if device not in self._indices:
            self._indices[device] = tuple(t.to(rows.device) for t in self._indices["cpu"])
        gather, back = self._indices[device]
        x = rows.to(a.dtype).index_select(0, gather).view(len(self.slots), self.length, -1)
        products = torch.bmm(torch.bmm(x, a), b).view(-1, b.shape[-1])
        out += torch.cat((products, products.new_zeros(1, products.shape[1]))).index_select(0, back)


def resolve_quantization(requested: str | None, device: torch.device, dtype: torch.dtype,
                         deterministic: bool = False) -> str:
    """The weights choice: as asked, else the default, which applies only to bf16 on the CPU."""
    if requested is None:
        on_cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16
        return CPU_BF16_DEFAULT if on_cpu_bf16 and not deterministic else "none"
    if requested not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {requested!r}")
    if requested != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {requested} runs on the CPU only; use --quantization none on {device}")
    return requested


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN computes linears in `dtype` on this CPU: bf16 and fp16 need AVX-512 (or
    AVX-NE-CONVERT); an AVX2-only CPU has only float32 kernels."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return dtype == torch.float32


class PackedLinear(torch.nn.Module):
    """A linear on oneDNN-prepacked weights. Where oneDNN has no kernel for the weights' dtype (bf16
    on an AVX2-only CPU), the weights are packed as float32 and the rows are computed in float32,
    then rounded once to their own dtype: the same sums as a bf16 kernel's float32 accumulation, and
    4-6x faster than torch's own bf16 matmul there at 8-512 rows (benchmarks/RESULTS.md)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int = 32,
                 rows: RowGroups | None = None) -> None:
        super().__init__()
        self.rows = rows
        self.lora: LoraPairs | None = LoraPairs()  # adapter slot -> (A.T, (scale * B).T)
        self.out_features, self.in_features = weight.shape
        self.compute_dtype = weight.dtype if packable(weight.dtype) else torch.float32
        self.weight = torch.nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().to(self.compute_dtype), batch_hint), requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(
            bias.detach().to(self.compute_dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            return self.dense(x)
        return self.rows.apply(self._dense_group, _flat(x), self.lora).view(*x.shape[:-1], self.out_features)

    def _dense_group(self, rows: torch.Tensor, full: bool) -> torch.Tensor:
        return self.dense(rows)

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """All of x's rows in one call."""
        # Under torch.compile the prepacked weight goes through an opaque op (inductor's lowering of oneDNN's
        # linear wants weights it packed itself); eagerly, straight to oneDNN (a custom op's dispatch costs ~10 us).
        linear = _packed_linear if torch.compiler.is_compiling() else _onednn_linear
        if x.dtype == self.compute_dtype:
            return linear(x, self.weight, self.bias)
        return linear(x.to(self.compute_dtype), self.weight, self.bias).to(x.dtype)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@torch.library.custom_op("conduit::packed_linear", mutates_args=())
def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _onednn_linear(x, weight, bias)


@_packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


class Int8Panels(torch.nn.Module):
    """int8 weights packed in panels for the native GEMM (int8_matmul.c), the full path of an int8
    linear where oneDNN has no bf16 GEMM: for prompt chunks and big steps it beats the float32 copy
    it replaces (one layer's matmuls at 16 / 64 / 512 rows: 0.9 / 3.6 / 26.1 ms against 1.5 / 4.2 /
    26.8, benchmarks/RESULTS.md) in a quarter of the memory. Each row's result is independent of the
    others, as the dot kernel's, but rounded apart from it."""

    def __init__(self, native: Kernels, weight: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__()
        n = weight.shape[0]
        self.out_features, self.bias = n, bias
        self.register_buffer("packed", native.int8_pack(weight))
        gemm, packed = native.int8_gemm, self.packed
        self._matmul = lambda rows: gemm(rows, packed, scales, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(_flat(x)).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class LowBitLinear(torch.nn.Module):
    """A linear on a low-bit kernel over the step's `rows` groups; where they keep full copies, also a
    oneDNN-packed copy of the dequantized weights, which runs instead for the groups they say
    (faster for many rows, rounded differently)."""

    def __init__(self, linear: torch.nn.Linear, rows: RowGroups | None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.rows = rows
        self.lora: LoraPairs | None = LoraPairs()  # adapter slot -> (A.T, (scale * B).T)
        self.full: PackedLinear | Int8Panels | None = None
        # The copy's forward as a plain attribute: a decode step calls ~120 linears, and nn.Module's
        # attribute lookup for a submodule costs ~1 us each time.
        self._full_forward = None

    @property
    def keeps_full_copy(self) -> bool:
        return self.rows is not None and self.rows.keeps_full_copies

    def keep_full_copy(self, dequantized: torch.Tensor) -> None:
        if self.keeps_full_copy:
            self.full = PackedLinear(dequantized, self.bias)
            self.full.lora = None  # this linear's adapters apply to both of its paths
            self._full_forward = self.full.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else _flat(x)  # the lean forward's [tokens, features]: no reshaping
        y = self._group(rows, False) if self.rows is None else self.rows.apply(self._group, rows, self.lora)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)  # not -1: a step may keep no rows

    def _group(self, rows: torch.Tensor, full: bool) -> torch.Tensor:
        if full and self._full_forward is not None:
            return self._full_forward(rows)
        y = self.kernel(rows)
        return y if self.bias is None else y + self.bias

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Int8Linear(LowBitLinear):
    """Symmetric int8 weights with one scale per output channel; run by the native kernel (`native`,
    model/native.py) where it supports the layer, else by torch's."""

    def __init__(self, linear: torch.nn.Linear, rows: RowGroups | None,
                 native: Kernels | None = None) -> None:
        super().__init__(linear, rows)
        # In place on a float32 copy (a tied weight, the output head's, is the embedding's too): an engine start
        # quantizes every linear, and each temporary of the whole weight cost its time.
        codes = linear.weight.detach().to(torch.float32, copy=True)
        scales = (torch.linalg.vector_norm(codes, float("inf"), dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        codes.div_(scales[:, None]).round_().clamp_(-127, 127)
        self.register_buffer("weight", codes.to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.native = native if native is not None and native.supports_int8(self.weight, linear.weight.dtype) else None
        # The native kernel takes float32 scales: the same values as `scales`, which the bf16 copy uses too.
        self.register_buffer("float_scales", self.scales.float() if self.native is not None else None)
        # Bound to this layer's weights once (no per-call buffer lookups); torch's kernel otherwise.
        if self.native is not None:
            matmul, weight, float_scales = self.native.int8_matmul, self.weight, self.float_scales
            self._matmul = lambda rows: matmul(rows, weight, float_scales)
        else:
            self._matmul = lambda rows: torch._weight_int8pack_mm(rows, self.weight, self.scales)
        if self.native is not None and self.keeps_full_copy and not packable(linear.weight.dtype):
            # No bf16 GEMM in oneDNN here: its copy would compute in float32 from 4x the bytes, slower
            # at every row count than the native GEMM on the int8 weights packed in panels.
            self.full = Int8Panels(self.native, self.weight, self.float_scales, self.bias)
            self._full_forward = self.full.forward
        elif self.keeps_full_copy:
            self.keep_full_copy(codes.mul_(self.scales.float()[:, None]).to(linear.weight.dtype))

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return self._matmul(rows)


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


class Int4Linear(LowBitLinear):
    """4-bit weights, groups of 32 inputs with a scale and a zero each (asymmetric)."""

    def __init__(self, linear: torch.nn.Linear, rows: RowGroups | None) -> None:
        super().__init__(linear, rows)
        weight = linear.weight.detach()
        codes, scales, zeros = int4_quantize(weight)
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("scales_and_zeros",
                             torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(weight.dtype))
        n, k = weight.shape
        dequantized = (codes.view(n, -1, INT4_GROUP) - 8) * scales[..., None] + zeros[..., None]
        self.keep_full_copy(dequantized.view(n, k).to(weight.dtype))

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(rows, self.packed, INT4_GROUP, self.scales_and_zeros)


def _replacement(linear: torch.nn.Linear, quantization: str, rows: RowGroups | None,
                 native_int8: Kernels | None) -> torch.nn.Module:
    if quantization == "int8":
        return Int8Linear(linear, rows, native_int8)
    if quantization == "int4" and linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0:
        return Int4Linear(linear, rows)
    return PackedLinear(linear.weight, linear.bias, rows=rows)


def quantize_linears(model: torch.nn.Module, quantization: str, rows: RowGroups | None = None,
                     native_int8: Kernels | None = None, head_rows: RowGroups | None = None) -> int:
    """Swap every CPU nn.Linear (the tied lm_head too: the embedding keeps its own weights) for the
    chosen kind; returns how many. int4 needs in_features % 32 == 0 and out_features % 16 == 0; other
    layers keep full weights. Each computes the step's `rows` groups apart (RowGroups; None: all rows
    in one call, no full copies); the model's output head (lm_head), which sees only the kept rows,
    computes `head_rows`' instead. int8 linears run `native_int8` where it supports them (None:
    torch's kernel). A no-op without oneDNN or off the CPU."""
    if not torch.backends.mkldnn.is_available():
        return 0
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.device.type == "cpu":
                groups = head_rows if child is output_embeddings else rows
                setattr(parent, name, _replacement(child, quantization, groups, native_int8))
                swapped += 1
    return swapped


class RowLinear(torch.nn.Module):
    """A linear off the CPU over the step's row groups (RowGroups), so LoRA adapters apply there too."""

    def __init__(self, linear: torch.nn.Linear, rows: RowGroups) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.rows = rows
        self.lora = LoraPairs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.rows.apply(lambda group, full: F.linear(group, self.weight, self.bias), _flat(x), self.lora)
        return rows.view(*x.shape[:-1], self.out_features)


def row_linears(model: torch.nn.Module, rows: RowGroups, head_rows: RowGroups) -> None:
    """Off the CPU (no quantize_linears there): every nn.Linear a RowLinear, the output head over `head_rows`."""
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, RowLinear(child, head_rows if child is output_embeddings else rows))


def one_row_rounds_differently(model: torch.nn.Module) -> bool:
    """Whether a one-row decode step would round differently from the same row among others: true
    when some linear runs a dense kernel there (oneDNN, cuBLAS and torch's own take a GEMV path for one
    row); the low-bit kernels give each row the same result at any row count."""
    copies = {id(m.full) for m in model.modules() if isinstance(m, LowBitLinear)}
    return any(isinstance(m, (torch.nn.Linear, PackedLinear, RowLinear)) and id(m) not in copies for m in model.modules())
