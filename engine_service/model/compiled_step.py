"""A compiled decode step: a decode-only step's forward (the lean Llama layers and the output head) captured
by torch.compile once per batch-size bucket, as vLLM and nano-vllm capture their decode steps.

A step's rows (its decode tokens and their draft tokens) are padded up to the next bucket with dummy rows that
write to the runner's scratch block, and its block tables to a fixed width, so every step of a bucket has the
same shapes and runs one compiled graph: inductor's C++ on the CPU, a CUDA graph on a GPU (mode
"reduce-overhead"; the KV cache's tensors are marked static, the in-place writes into them stay in the graph).
The native int8, add + RMSNorm and decode-attention kernels are registered torch ops (model/native.py), so the
graph holds them whole. Where decode attention reads the paged cache in place (the native kernel reads each
row's own length) the tables are as wide as the longest sequence's; where it gathers (SDPA, the GPU) their
width is a dimension the graph leaves symbolic, so a longer context needs no new compile.

Every bucket compiles at engine start (`warm_up`), for each torch thread count the engine will use (a
shared-cores engine runs on two); inductor keeps what it built under the cache folder
(CONDUIT_CACHE_DIR/inductor), so a second start reuses it. Steps with prompt chunks, LoRA adapters, a
give-way check, or more rows than the largest bucket run eagerly, as does everything when a compile fails
(one log line says why). Figures and the CPU default: benchmarks/RESULTS.md, "A compiled decode step".
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import torch

from engine_service.model import attention
from engine_service.model.cache_dir import cache_dir
from engine_service.model.step import StepInput

if TYPE_CHECKING:
    from engine_service.model.runner import ModelRunner, PackedBatch

log = logging.getLogger(__name__)

# Rows per compiled graph. LOW_BIT_MAX_ROWS (model/linear.py) is one of them, so a padded step takes the
# same kernels (low-bit or full copies) as the step unpadded would.
BUCKETS = (1, 2, 4, 8, 16, 32)


def wanted(mode: str, device: torch.device) -> bool:
    """mode: EngineConfig.compiled_step (on, off, auto: on a GPU only). On the CPU the compiled step measured no
    faster than the eager one (the native kernels hold most of a step) while each bucket costs a compile."""
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def buckets_for(max_rows: int, smallest: int) -> list[int]:
    """The buckets from `smallest` up to one that holds `max_rows`."""
    chosen = [b for b in BUCKETS if smallest <= b < max_rows]
    return chosen + [max(max_rows, smallest)]


class CompiledDecode:
    """Runs a ModelRunner's decode-only steps through one torch.compile'd forward, padded to a bucket."""

    def __init__(self, runner: ModelRunner, max_rows: int) -> None:
        assert runner.lean is not None, "the compiled step runs the lean forward"
        self.runner = runner
        # A lone decode row rounds differently in some dense kernels (runner.add_padding_row): never fewer than 2.
        self.buckets = buckets_for(max_rows, 2 if runner.pads_single_rows else 1)
        self.in_place = runner.decode_attention is not None
        self.cuda = runner.device.type == "cuda"
        self.steps = 0  # decode steps run compiled (the warm-up's not counted)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        if self.cuda:
            for tensor in (*runner.cache.keys, *runner.cache.values):
                torch._dynamo.mark_static_address(tensor)
        options = None if self.cuda else {"cpp_wrapper": True}  # no Python between the graph's kernels
        mode = "reduce-overhead" if self.cuda else None
        # One graph per bucket, each a recompile of the same function (and engines in one process share it).
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(BUCKETS))
        lean, cache, kernel, block_size = runner.lean, runner.cache, runner.decode_attention, runner.block_size

        def decode(input_ids: torch.Tensor, position_ids: torch.Tensor, slots: torch.Tensor, block_ids: torch.Tensor,
                   lens: torch.Tensor) -> torch.Tensor:
            rows = lens.shape[0]
            # The layout is built in the graph: its context length follows block_ids' (maybe symbolic) length.
            layout = attention.StepLayout(cache=cache, slot_mapping=slots, num_decode=rows, decode_block_ids=block_ids,
                                          decode_lens=lens, max_decode_context=block_ids.shape[0] // rows * block_size,
                                          prefills=[], decode_kernel=kernel)
            return lean.lm_head(lean.final_hidden(input_ids, position_ids, slice(None), layout))

        self.forward_compiled = torch.compile(decode, dynamic=False, fullgraph=True, mode=mode, options=options)

    def bucket(self, step: StepInput) -> int | None:
        """The bucket for this step's rows, or None when the step runs eagerly."""
        if step.prefill or any(row.adapter for row in step.decode):
            return None
        rows = sum(1 + len(row.drafts) for row in step.decode)
        return next((b for b in self.buckets if b >= rows), None)

    def pad(self, batch: PackedBatch, bucket: int) -> None:
        """Dummy decode rows (the runner's padding row) up to `bucket`; their logits rows are kept and dropped."""
        while len(batch.decode_lens) < bucket:
            self.runner.add_padding_row(batch)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Float32 logits [bucket, vocab] on the CPU of a padded decode-only batch (rows as batch.keep: all)."""
        runner = self.runner
        block_size, device = runner.block_size, runner.device
        needed = -(-max(batch.decode_lens) // block_size)
        # In place: the kernel reads each row's own length, so one width fits all (the longest a table gets).
        # Gathered: the gather's length follows the width, a dimension left dynamic (at least 2: a size of 1
        # would be specialized), in whole powers of two so the gathers stay few sizes.
        width = runner.max_blocks if self.in_place else max(2, 1 << (needed - 1).bit_length())
        tables = [b for table in batch.decode_tables for b in table[:width] + [0] * (width - len(table))]
        block_ids = torch.tensor(tables, dtype=torch.long, device=device)
        if not self.in_place:
            torch._dynamo.mark_dynamic(block_ids, 0)
        tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are read: the graph may reuse them
        self.steps += 1
        logits = self.forward_compiled(tensor([batch.input_ids]), tensor([batch.positions]), tensor(batch.slots),
                                       block_ids, tensor(batch.decode_lens))
        return logits.float().cpu()

    def warm_up(self, threads: int | None = None) -> float:
        """Compiles every bucket (dummy rows in the scratch block) for `threads` torch threads (default: the
        current count: inductor builds its CPU kernels for one, and dynamo compiles again for another); returns
        the seconds it took. Raises what the compiler raised."""
        from engine_service.model.runner import PackedBatch

        started, previous = time.monotonic(), torch.get_num_threads()
        torch.set_num_threads(threads or previous)
        try:
            for bucket in self.buckets:
                batch = PackedBatch()
                self.pad(batch, bucket)
                self.runner.set_row_groups(batch)
                with torch.inference_mode():
                    self.forward(batch)
        finally:
            torch.set_num_threads(previous)
        self.steps = 0
        return time.monotonic() - started
