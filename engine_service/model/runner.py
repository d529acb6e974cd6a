"""Runs one engine step through the model: a StepInput in (model/step.py), logits out (and, for
the prompt chunks that end an embedding's input, the final norm's hidden row of its last token).

The whole step is one forward pass over a packed [1, T] sequence (decode tokens
first, then prompt chunks); the paged attention function keeps sequences apart.
prepare_decode and prepare_prefill pack the tokens, forward runs the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import logging

import torch

from engine_service.model import attention, llama, native
from engine_service.model.compiled_step import CompiledDecode
from engine_service.model.linear import (RowGroups, low_bit_max_rows, one_row_rounds_differently, quantize_linears,
                                         resolve_quantization, row_linears)
from engine_service.model.lora import LoraWeights, linear_pairs
from engine_service.model.rotary import install_rotary_table
from engine_service.model.kv_cache import CacheShape, KVCache
from engine_service.model.step import DecodeRow, PromptChunk, Segments, StepInput, StepLogits

log = logging.getLogger(__name__)


@dataclass
class PromptRows:
    """A prefill chunk whose every logits row is kept (echo with logprobs)."""

    seq_id: int
    first_position: int
    first_row: int  # in the kept logits
    count: int


@dataclass
class PackedBatch:
    """One step's tokens packed into a single row, where each goes in the cache, and which rows of
    logits to keep and for whom."""

    input_ids: list[int] = field(default_factory=list)
    adapters: list[int] = field(default_factory=list)  # each token's LoRA adapter slot (0: the base model)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # flat cache slot of each token
    decode_tables: list[list[int]] = field(default_factory=list)  # one per decode row
    decode_lens: list[int] = field(default_factory=list)  # context length of each decode row
    prefills: list[attention.PrefillChunk] = field(default_factory=list)  # one per prompt segment
    keep: list[int] = field(default_factory=list)  # packed positions whose logits are computed
    next_token_rows: dict[int, int] = field(default_factory=dict)  # seq_id -> row in the kept logits
    draft_rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq_id -> (first kept row, count)
    prompt_rows: list[PromptRows] = field(default_factory=list)
    hidden_rows: dict[int, int] = field(default_factory=dict)  # seq_id -> kept row whose hidden state is wanted

    def add(self, token: int, position: int, slot: int, adapter: int = 0) -> None:
        self.input_ids.append(token)
        self.adapters.append(adapter)
        self.positions.append(position)
        self.slots.append(slot)

    def keep_row(self, packed_position: int) -> int:
        self.keep.append(packed_position)
        return len(self.keep) - 1


def adapter_runs(adapters: list[int], group_ends: list[int]) -> list[tuple[int, int, int]]:
    """(first row, end row, adapter slot) of each run of rows with one adapter, cut at the groups' ends."""
    runs: list[tuple[int, int, int]] = []
    cuts = set(group_ends)
    for row, slot in enumerate(adapters):
        if not slot:
            continue
        if runs and runs[-1][1] == row and runs[-1][2] == slot and row not in cuts:
            runs[-1] = (runs[-1][0], row + 1, slot)
        else:
            runs.append((row, row + 1, slot))
    return runs


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                 block_size: int, num_blocks: int, max_positions: int,
                 quantization: str | None = None, deterministic: bool = False, lean_forward: bool = True,
                 native_kernels: bool = True, segments: Segments | None = None, enable_lora: bool = False) -> None:
        """quantization: see weight_formats.QUANTIZATIONS (None: the default for the device and dtype);
        deterministic: a sequence's results never depend on the batch it runs in;
        lean_forward: Llama models run model/llama.py's forward (False: transformers', for comparison);
        native_kernels: int8 linears, decode attention and the lean forward's add + RMSNorm run
        model/native.py's kernels where they build (False: torch's); segments: where prompt segments begin
        (model/step.py; None: the default for block_size); enable_lora: off the CPU, linears that take LoRA
        adapters (on the CPU they always can)."""
        self.model = model
        self.dtype = dtype
        install_rotary_table(model, max_positions, device)
        # The base linears as transformers built them, which LoRA adapters name (model/lora.py).
        self.linear_shapes = {name: (m.out_features, m.in_features) for name, m in model.named_modules()
                              if isinstance(m, torch.nn.Linear)}
        lean = lean_forward and llama.supports(model)
        self.fused_parts = llama.fused_parts(model.config) if lean else {}
        if lean:
            llama.fuse_projections(model)  # before quantizing: fused linears are quantized like the rest
        self.quantization = resolve_quantization(quantization, device, dtype, deterministic)
        native_on_cpu = native_kernels and device.type == "cpu"
        kernels = native.kernels() if native_on_cpu else None
        native_int8 = kernels if self.quantization == "int8" else None
        # Each linear computes the decode rows and each prompt segment apart; low-bit linears run bf16
        # copies for prompt segments and many decode rows, unless deterministic.
        max_rows = None if deterministic else low_bit_max_rows(dtype, native_int8)
        self.rows, self.head_rows = RowGroups(max_rows), RowGroups(max_rows)
        self.segments = segments or Segments.for_engine(block_size)
        if device.type == "cpu":
            quantize_linears(model, self.quantization, self.rows, native_int8, self.head_rows)
        elif enable_lora:
            row_linears(model, self.rows, self.head_rows)
        self.int8_kernel = "native" if native_int8 is not None else "torch"
        self.lean = llama.LeanLlama(model, kernels if dtype in native.DTYPES else None) if lean else None
        self.pads_single_rows = one_row_rounds_differently(model)
        self.device = device
        config = model.config
        model.config._attn_implementation = attention.register()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache = KVCache(
            CacheShape(config.num_hidden_layers, config.num_key_value_heads, head_dim, block_size, num_blocks),
            dtype=dtype, device=device,
        )
        # Decided once for the model; a softcapped layer still takes torch's path (attention.py).
        fits = native.Kernels.supports_attention(config.num_attention_heads, config.num_key_value_heads, head_dim,
                                                 dtype)
        self.decode_attention = kernels.decode_attention if kernels is not None and fits else None
        self.block_size = block_size
        self.max_blocks = -(-max_positions // block_size)  # the longest block table a sequence gets
        # The last block is never handed out: padding tokens write there.
        self.scratch_block = num_blocks - 1
        self.compiled: CompiledDecode | None = None  # compile_decode

    def compile_decode(self, max_rows: int) -> str:
        """Decode-only steps of up to `max_rows` rows through a compiled forward (model/compiled_step.py), each
        bucket compiled now; what happened, for the start log (on failure the steps stay eager)."""
        if self.lean is None:
            return "off (the model does not run the lean Llama forward)"
        try:
            compiled = CompiledDecode(self, max_rows)
            seconds = compiled.warm_up()
        except Exception as exc:  # whatever the compiler cannot take: eager, said once
            return f"off, eager: the compiler failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        self.compiled = compiled
        return f"compiled for {compiled.buckets} rows in {seconds:.1f} s"

    @torch.inference_mode()
    def run(self, step: StepInput, give_way: Callable[[], bool] | None = None) -> StepLogits:
        """give_way: asked before each layer; True stops the step there (StepGaveWay, model/step.py)."""
        bucket = self.compiled.bucket(step) if self.compiled is not None and give_way is None else None
        batch = PackedBatch()
        self.prepare_decode(batch, step.decode)
        if bucket is not None:
            self.compiled.pad(batch, bucket)
        elif len(batch.decode_lens) == 1 and self.pads_single_rows:
            self.add_padding_row(batch)
        self.prepare_prefill(batch, step.prefill)
        self.set_row_groups(batch)
        if bucket is not None:
            try:
                logits, hidden = self.compiled.forward(batch), None
            except Exception:  # a guard failed and its recompile did not take: eager from now on, said once
                log.exception("the compiled decode step failed; decode steps run eagerly from now on")
                self.compiled = None
                return self.run(step, give_way)
        else:
            logits, hidden = self.forward(batch, give_way)
        return StepLogits(
            next_token={seq_id: logits[row] for seq_id, row in batch.next_token_rows.items()},
            drafts={seq_id: logits[first:first + count] for seq_id, (first, count) in batch.draft_rows.items()},
            prompt={p.seq_id: (p.first_position, logits[p.first_row:p.first_row + p.count])
                    for p in batch.prompt_rows},
            hidden={seq_id: hidden[row] for seq_id, row in batch.hidden_rows.items()})

    def _slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size

    def prepare_decode(self, batch: PackedBatch, rows: list[DecodeRow]) -> None:
        """One token per decoding sequence, its last, not yet cached, token; then a row for each of its
        draft tokens, each over its own context (the tokens before it), as if decoded one by one."""
        for row in sorted(rows, key=lambda row: row.adapter):  # an adapter's rows together: one run each
            batch.next_token_rows[row.seq_id] = batch.keep_row(len(batch.input_ids))
            for offset, token in enumerate([row.token, *row.drafts]):
                position = row.position + offset
                if offset == 1:
                    batch.draft_rows[row.seq_id] = (len(batch.keep), len(row.drafts))
                if offset:
                    batch.keep_row(len(batch.input_ids))
                batch.add(token, position, self._slot(row.block_table, position), row.adapter)
                batch.decode_tables.append(row.block_table)
                batch.decode_lens.append(position + 1)

    def add_padding_row(self, batch: PackedBatch) -> None:
        """One-row dense matmuls take a different (GEMV) kernel whose rounding differs, so a sequence
        decoding alone would not match itself in a batch. A dummy decode row in the scratch block makes
        two; its logits row is kept (the decode rows' matmuls stay one group) and dropped. (Not needed
        when every linear is a low-bit kernel: those round each row alike.)"""
        batch.keep_row(len(batch.input_ids))
        batch.add(0, 0, self.scratch_block * self.block_size)
        batch.decode_tables.append([self.scratch_block])
        batch.decode_lens.append(1)

    def set_row_groups(self, batch: PackedBatch) -> None:
        """The linears' groups: the decode rows (padding included), then each prompt segment; the
        output head's, the kept rows of each of those in turn."""
        num_decode = len(batch.decode_lens)
        group_ends = [num_decode, *(chunk.start + chunk.length for chunk in batch.prefills)]
        self.rows.set_for_step([(num_decode, False), *((chunk.length, True) for chunk in batch.prefills)],
                               adapter_runs(batch.adapters, group_ends))
        kept: list[list] = []  # [kept rows, is a prompt segment] per group that keeps any (batch.keep ascends)
        group, last = 0, -1
        for row in batch.keep:
            while row >= group_ends[group]:
                group += 1
            if group != last:
                kept.append([0, group > 0])
                last = group
            kept[-1][0] += 1
        self.head_rows.set_for_step([(count, prompt) for count, prompt in kept])

    def load_adapter(self, slot: int, weights: LoraWeights) -> None:
        """The adapter's low-rank pairs into the linears it targets, under `slot` (>= 1)."""
        self.place_adapter(slot, self.adapter_pairs(weights))

    def adapter_pairs(self, weights: LoraWeights) -> dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
        """The adapter's pairs by the linear that takes each, on the host (a LoRA adapter loaded, not yet
        resident: core/adapters.py); AdapterError for a target this model does not run. On the CPU they compute
        in float32: torch's bf16 matmuls of a few rows by a small rank cost ~50 us each against ~10 in float32,
        and a step runs two per linear and adapter run."""
        lora_dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        return linear_pairs(self.model, weights, lora_dtype, self.fused_parts)

    def place_adapter(self, slot: int, pairs: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Pairs from adapter_pairs into their linears under `slot` (>= 1): the adapter is resident."""
        for module, pair in pairs.items():
            module.lora[slot] = tuple(t.to(self.device) for t in pair)

    def unload_adapter(self, slot: int) -> None:
        for module in self.model.modules():
            if getattr(module, "lora", None):
                module.lora.pop(slot, None)

    def prepare_prefill(self, batch: PackedBatch, chunks: list[PromptChunk]) -> None:
        """Each prompt chunk after the decode rows; logits for the chunk's last token when it ends the
        prompt, or for all of its tokens when the prompt's logprobs are wanted."""
        for chunk in chunks:
            start, first, length = len(batch.input_ids), chunk.first_position, len(chunk.token_ids)
            context = first + length
            for position, token in enumerate(chunk.token_ids, first):
                batch.add(token, position, self._slot(chunk.block_table, position), chunk.adapter)
            table = torch.tensor(chunk.block_table[:-(-context // self.block_size)], dtype=torch.long,
                                 device=self.device)
            for segment_first, segment_length in self.segments.split(first, length):
                end = segment_first + segment_length
                batch.prefills.append(attention.PrefillChunk(start + segment_first - first, segment_length, end,
                                                             table[:-(-end // self.block_size)]))
            if chunk.keep_all_rows:
                rows = [batch.keep_row(p) for p in range(start, start + length)]
                batch.prompt_rows.append(PromptRows(chunk.seq_id, first, rows[0], length))
                if chunk.ends_prompt:
                    batch.next_token_rows[chunk.seq_id] = rows[-1]
            elif chunk.ends_prompt:
                batch.next_token_rows[chunk.seq_id] = batch.keep_row(start + length - 1)
            if chunk.ends_prompt and chunk.wants_hidden:
                batch.hidden_rows[chunk.seq_id] = batch.next_token_rows[chunk.seq_id]

    def forward(self, batch: PackedBatch, give_way: Callable[[], bool] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model over the packed batch: float32 logits of the kept rows, on the CPU; and where
        `batch.hidden_rows` wants any, the final norm's output at the kept rows (else None)."""
        device = self.device
        block_ids = lens = None
        max_context = 0
        if batch.decode_lens:
            width = -(-max(batch.decode_lens) // self.block_size)
            # Whole blocks: a sequence's softmax then reduces over the same padded length
            # whether it runs alone or beside longer ones, so its output is batch-invariant.
            max_context = width * self.block_size
            padded = [t[:width] + [0] * (width - len(t)) for t in batch.decode_tables]
            block_ids = torch.tensor([b for table in padded for b in table], dtype=torch.long, device=device)
            lens = torch.tensor(batch.decode_lens, device=device)
        layout = attention.StepLayout(
            cache=self.cache,
            slot_mapping=torch.tensor(batch.slots, dtype=torch.long, device=device),
            num_decode=len(batch.decode_lens),
            decode_block_ids=block_ids,
            decode_lens=lens,
            max_decode_context=max_context,
            prefills=batch.prefills,
            decode_kernel=self.decode_attention,
            give_way=give_way,
        )
        input_ids = torch.tensor([batch.input_ids], device=device)
        position_ids = torch.tensor([batch.positions], device=device)
        # Empty when the step only prefills the middle of a prompt: no logits then.
        keep = torch.tensor(batch.keep, dtype=torch.long, device=device)
        hidden = None
        if self.lean is not None:
            hidden = self.lean.final_hidden(input_ids, position_ids, keep, layout)
            logits = self.lean.lm_head(hidden)
        else:
            # hidden_states[-1] is the base model's output, after its final norm (only asked for when wanted).
            out = self.model(input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep, use_cache=False,
                             layout=layout, output_hidden_states=bool(batch.hidden_rows))
            logits = out.logits[0]
            if batch.hidden_rows:
                hidden = out.hidden_states[-1][0, keep]
        wanted = None if hidden is None or not batch.hidden_rows else hidden.float().cpu()
        return logits.float().cpu(), wanted
