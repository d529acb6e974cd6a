"""Echo with logprobs: the logprob of each prompt token given the ones before it.

A prompt chunk's logits are one row per token, but the runner keeps only each sequence's last
row unless asked: `wanted` names the sequences whose chunks need every row (once per request:
its leader, before its first token), and `collect` turns those rows into the leader's
prompt_logprobs, which its PromptEvent carries (choices.py).
"""

from __future__ import annotations

import torch

from engine_service.core.sampler import token_logprob
from engine_service.core.scheduler import ScheduledBatch
from engine_service.model.step import StepLogits


def wanted(batch: ScheduledBatch) -> set[int]:
    """Sequences (by seq_id) whose prompt chunk needs every logits row."""
    return {seq.seq_id for seq, _ in batch.prefill
            if seq.params.wants_prompt_logprobs and seq.index == 0 and seq.num_output == 0}


def collect(batch: ScheduledBatch, logits: StepLogits) -> None:
    """Append the logprobs of the prompt tokens this step's chunks computed."""
    for seq, _ in batch.prefill:
        if seq.seq_id not in logits.prompt:
            continue
        first, rows = logits.prompt[seq.seq_id]
        if len(seq.prompt_logprobs) != first + 1:  # already collected before a preemption
            continue
        targets = seq.token_ids[first + 1:min(first + 1 + rows.shape[0], seq.prompt_len)]
        if not targets:
            continue
        logp = torch.log_softmax(rows[:len(targets)], dim=-1)
        for i, target in enumerate(targets):
            seq.prompt_logprobs.append(token_logprob(logp[i], target, seq.params.top_logprobs))
