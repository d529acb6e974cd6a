"""A BERT encoder's forward over many inputs packed end to end, without padding.

transformers' BertModel runs a batch as [rows, longest row]: every linear layer (nearly all of the
work) computes the padding too. Short queries of 8 to 19 tokens, as they arrive, cost ~40% more so
than their own tokens. Here the embeddings, linears and layer norms run on the packed [tokens,
hidden] rows; only attention, which must keep the inputs apart, sees them padded (scattered into
[rows, heads, longest, head size] and back), with the padding masked as BertModel masks it. The
same weights and ops, so the vectors equal BertModel's up to float rounding
(tests/test_engine_embeddings.py). vLLM runs its encoders so, with varlen attention on GPUs.

Only a plain BertModel qualifies (absolute positions, no decoder or cross-attention, no chunked
feed-forward); any other model keeps transformers' padded forward (encoder.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supports(model: torch.nn.Module) -> bool:
    from transformers import BertModel

    config = getattr(model, "config", None)
    return (type(model) is BertModel and not config.is_decoder and not config.add_cross_attention
            and not config.chunk_size_feed_forward
            and getattr(config, "position_embedding_type", "absolute") == "absolute")


class PackedBert:
    """Call with the inputs' token ids -> (hidden states [tokens, hidden] of all inputs end to end,
    each input's first row in them [rows + 1]). Holds the model's modules, not copies of them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.embeddings = model.embeddings
        self.layers = list(model.encoder.layer)
        config = model.config
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        # q, k and v as one matmul (one op a layer, not three); concatenated once, at load.
        self.qkv = [(torch.cat([a.query.weight, a.key.weight, a.value.weight]),
                     torch.cat([a.query.bias, a.key.bias, a.value.bias]))
                    for a in (layer.attention.self for layer in self.layers)]

    @torch.inference_mode()
    def __call__(self, inputs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(ids) for ids in inputs])
        rows, longest, tokens = len(inputs), int(lengths.max()), int(lengths.sum())
        starts = torch.zeros(rows + 1, dtype=torch.long)
        torch.cumsum(lengths, 0, out=starts[1:])
        ids = torch.tensor([t for row in inputs for t in row], dtype=torch.long)
        positions = torch.arange(tokens) - torch.repeat_interleave(starts[:-1], lengths)
        # Where each packed token sits in the padded [rows * longest] layout attention needs.
        slots = positions + torch.repeat_interleave(torch.arange(rows) * longest, lengths)
        keep = torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)  # [rows, longest]: real tokens
        ids, positions, slots, keep = (t.to(device) for t in (ids, positions, slots, keep))
        mask = keep[:, None, None, :]  # attend to real keys only, as BertModel's mask does

        e = self.embeddings
        h = e.LayerNorm(e.word_embeddings(ids) + e.token_type_embeddings.weight[0] + e.position_embeddings(positions))
        for layer, (qkv_weight, qkv_bias) in zip(self.layers, self.qkv):
            attention = layer.attention
            qkv = F.linear(h, qkv_weight, qkv_bias)  # [tokens, 3 * hidden]
            padded = qkv.new_zeros(rows * longest, qkv.shape[1])
            padded[slots] = qkv
            q, k, v = padded.view(rows, longest, 3, self.heads, self.head_size).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attention.self.scaling)
            out = out.transpose(1, 2).reshape(rows * longest, -1)[slots]  # back to [tokens, hidden]
            h = attention.output.LayerNorm(attention.output.dense(out) + h)
            h = layer.output.LayerNorm(layer.output.dense(layer.intermediate(h)) + h)
        return h, starts.to(device)


def pool_packed(hidden: torch.Tensor, starts: torch.Tensor, mode: str) -> torch.Tensor:
    """[tokens, hidden] of inputs end to end -> [rows, hidden], as encoder.pool does for padded rows."""
    if mode == "cls":
        return hidden[starts[:-1]]
    if mode == "lasttoken":
        return hidden[starts[1:] - 1]
    lengths = starts[1:] - starts[:-1]
    row_of_token = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths)
    sums = hidden.new_zeros(len(lengths), hidden.shape[1]).index_add_(0, row_of_token, hidden)
    return sums / lengths.unsqueeze(1).to(hidden.dtype)
