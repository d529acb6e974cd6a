"""Runs one engine step through the model: packs the scheduled tokens, returns logits.

The whole step is one forward pass over a packed [1, T] sequence (decode tokens
first, then prompt chunks); the paged attention function keeps sequences apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_service import attention
from engine_service.packed_linear import pack_linears
from engine_service.rotary import install_rotary_table
from engine_service.kv_cache import CacheShape, KVCache
from engine_service.scheduler import ScheduledBatch
from engine_service.sequence import Sequence


@dataclass
class StepLogits:
    """Logits rows the step produced, by purpose."""

    next_token: dict[int, torch.Tensor]  # seq_id -> [vocab] logits for its next token
    prompt: dict[int, tuple[int, torch.Tensor]]  # seq_id -> (first position, [chunk, vocab]) for prompt logprobs


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                 block_size: int, num_blocks: int, max_positions: int) -> None:
        self.model = model
        install_rotary_table(model, max_positions, device)
        if device.type == "cpu":
            pack_linears(model, batch_hint=32)
        self.device = device
        config = model.config
        model.config._attn_implementation = attention.register()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache = KVCache(
            CacheShape(config.num_hidden_layers, config.num_key_value_heads, head_dim, block_size, num_blocks),
            dtype=dtype, device=device,
        )
        self.block_size = block_size
        # The last block is never handed out: padding tokens write there.
        self.scratch_slot = (num_blocks - 1) * block_size

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, wants_prompt_logprobs: set[int]) -> StepLogits:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        keep: list[int] = []  # packed positions whose logits we need
        owners: list[tuple[Sequence, str]] = []  # what each kept row is for

        tables: list[list[int]] = []
        lens: list[int] = []
        for seq in batch.decode:
            pos = seq.num_cached
            keep.append(len(ids))
            owners.append((seq, "next"))
            ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            tables.append(seq.block_table)
            lens.append(pos + 1)
        if len(batch.decode) + sum(length for _, length in batch.prefill) < 2:
            # One-row matmuls take a different (GEMV) kernel whose rounding differs, so a
            # sequence running alone would not match itself in a batch. Pad with a dummy
            # decode row that lives in the scratch block; its logits row comes last and is dropped.
            dummy_row = len(ids)
            ids.append(0)
            positions.append(0)
            slots.append(self.scratch_slot)
            tables.append([self.scratch_slot // bs])
            lens.append(1)

        decode_tables = decode_mask = None
        max_ctx = 0
        if tables:
            width = -(-max(lens) // bs)
            # Whole blocks: a sequence's softmax then reduces over the same padded length
            # whether it runs alone or beside longer ones, so its output is batch-invariant.
            max_ctx = width * bs
            decode_tables = torch.tensor([t[:width] + [0] * (width - len(t[:width])) for t in tables],
                                         dtype=torch.long, device=self.device)
            lens_t = torch.tensor(lens, device=self.device)
            decode_mask = (torch.arange(max_ctx, device=self.device)[None, :] < lens_t[:, None])[:, None, None, :]

        chunks: list[attention.PrefillChunk] = []
        for seq, length in batch.prefill:
            start, first = len(ids), seq.num_cached
            ctx = first + length
            ids.extend(seq.token_ids[first:ctx])
            positions.extend(range(first, ctx))
            slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(first, ctx))
            mask = None
            if first:
                mask = (torch.arange(ctx, device=self.device)[None, :]
                        <= torch.arange(first, ctx, device=self.device)[:, None])
            table = torch.tensor(seq.block_table[:-(-ctx // bs)], dtype=torch.long, device=self.device)
            chunks.append(attention.PrefillChunk(start, length, ctx, table, mask))
            completes = ctx == len(seq.token_ids)
            if seq.seq_id in wants_prompt_logprobs:
                keep.extend(range(start, start + length))
                owners.append((seq, "prompt"))
            elif completes:
                keep.append(start + length - 1)
                owners.append((seq, "next"))

        if len(tables) > len(batch.decode):
            keep.append(dummy_row)

        layout = attention.StepLayout(
            cache=self.cache,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            num_decode=len(tables),
            decode_block_tables=decode_tables,
            decode_mask=decode_mask,
            max_decode_context=max_ctx,
            prefills=chunks,
        )
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            logits_to_keep=torch.tensor(keep, device=self.device),
            use_cache=False,
            layout=layout,
        )
        logits = out.logits[0].float().cpu()
        return self._split(logits, owners, batch)

    @staticmethod
    def _split(logits: torch.Tensor, owners: list[tuple[Sequence, str]], batch: ScheduledBatch) -> StepLogits:
        result = StepLogits(next_token={}, prompt={})
        chunk_len = {seq.seq_id: length for seq, length in batch.prefill}
        row = 0
        for seq, purpose in owners:
            if purpose == "next":
                result.next_token[seq.seq_id] = logits[row]
                row += 1
            else:
                n = chunk_len[seq.seq_id]
                rows = logits[row:row + n]
                result.prompt[seq.seq_id] = (seq.num_cached, rows)
                if seq.num_cached + n == len(seq.token_ids):
                    result.next_token[seq.seq_id] = rows[-1]
                row += n
        return result
