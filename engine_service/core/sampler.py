"""Per-request sampling for a whole batch of logits rows.

Each row keeps its own parameters. Common work (softmax, argmax, noise) is batched;
rare features (penalties, bias, top-k/p filters, seeds) touch only the rows that use
them. A seeded row draws its noise from its own generator, so its output does not
depend on what else is in the batch.
"""

from __future__ import annotations

import torch

from engine_service.core.events import TokenLogprob
from engine_service.core.sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
    """logits: [rows, vocab] float32, one row per sequence. Returns tokens and logprobs."""
    if all(_plain_greedy(s) for s in seqs):  # the common case: nothing to adjust, just argmax
        return logits.argmax(dim=-1).tolist(), [None] * len(seqs)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if any(s.params.logprobs for s in seqs) else None
    logits = logits.clone()
    _apply_adjustments(logits, seqs)

    tokens = torch.empty(len(seqs), dtype=torch.long)
    greedy = [i for i, s in enumerate(seqs) if s.params.sampling.greedy]
    sampled = [i for i, s in enumerate(seqs) if not s.params.sampling.greedy]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    if sampled:
        tokens[sampled] = _sample_rows(logits[sampled], [seqs[i] for i in sampled])

    token_list = tokens.tolist()
    logprobs: list[TokenLogprob | None] = [None] * len(seqs)
    if raw_logprobs is not None:
        for i, seq in enumerate(seqs):
            if seq.params.logprobs:
                logprobs[i] = token_logprob(raw_logprobs[i], token_list[i], seq.params.top_logprobs)
    return token_list, logprobs


def _plain_greedy(seq: Sequence) -> bool:
    sp = seq.params.sampling
    return (sp.greedy and not seq.params.logprobs and not sp.logit_bias and not sp.needs_penalties
            and not seq.constrained and seq.forced_token is None and seq.num_output >= seq.params.stopping.min_tokens)


def token_logprob(row: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    top: list[tuple[int, float]] = []
    if top_n:
        values, ids = torch.topk(row, top_n)
        top = list(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token_id=token_id, logprob=float(row[token_id]), top=top)


def _apply_adjustments(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    for i, seq in enumerate(seqs):
        sp = seq.params.sampling
        if sp.logit_bias:
            ids = torch.tensor(list(sp.logit_bias.keys()), dtype=torch.long)
            logits[i, ids] += torch.tensor(list(sp.logit_bias.values()), dtype=logits.dtype)
        if sp.needs_penalties:
            _apply_penalties(logits[i], seq)
        if seq.num_output < seq.params.stopping.min_tokens and seq.stop_ids:
            logits[i, list(seq.stop_ids)] = float("-inf")
        if seq.constrained:
            seq.matcher.mask_logits(logits[i])
        forced = seq.forced_token
        if forced is not None:  # a spent thinking budget: the end marker, token by token
            kept = logits[i, forced].clone()
            logits[i] = float("-inf")
            logits[i, forced] = kept if torch.isfinite(kept) else 0.0


def _apply_penalties(row: torch.Tensor, seq: Sequence) -> None:
    sp = seq.params.sampling
    vocab = row.shape[0]
    if sp.repetition_penalty != 1.0:
        # HF/CTRL style, over prompt and output tokens.
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / sp.repetition_penalty, values * sp.repetition_penalty)
    if (sp.presence_penalty or sp.frequency_penalty) and seq.num_output:
        # OpenAI style, over generated tokens only.
        counts = torch.bincount(torch.tensor(seq.output_ids, dtype=torch.long), minlength=vocab).to(row.dtype)
        row -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(row.dtype)


def _sample_rows(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    temps = torch.tensor([s.params.sampling.temperature for s in seqs], dtype=logits.dtype)
    logits = logits / temps.unsqueeze(1)
    for i, seq in enumerate(seqs):
        if seq.params.sampling.needs_filters:
            _filter_row(logits[i], seq)
    probs = torch.softmax(logits, dim=-1)
    # Exponential race (Gumbel-max): argmax(p / E) with E ~ Exp(1) samples from p.
    noise = torch.empty_like(probs).exponential_()
    for i, seq in enumerate(seqs):
        if seq.generator is not None:
            noise[i] = torch.empty(probs.shape[1], dtype=probs.dtype).exponential_(generator=seq.generator)
    return (probs / noise).argmax(dim=-1)


def _filter_row(row: torch.Tensor, seq: Sequence) -> None:
    sp = seq.params.sampling
    if sp.top_k > 0 and sp.top_k < row.shape[0]:
        kth = torch.topk(row, sp.top_k).values[-1]
        row[row < kth] = float("-inf")
    if sp.min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row[probs < sp.min_p * probs.max()] = float("-inf")
    if sp.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (keeps at least one).
        drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= sp.top_p
        row[order[drop]] = float("-inf")
