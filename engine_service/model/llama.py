"""A lean forward for Llama-architecture models: transformers' LlamaForCausalLM math, bit for bit,
without its per-module Python.

A decode step at a small batch is a few hundred small ops per layer stack; on the CPU the module
calls, decorators and keyword plumbing around them cost ~2 ms of a ~15 ms batch-1 step, and q/k/v
(and gate/up) as separate matmuls pay each call's fixed cost three (two) times. Here q/k/v and
gate/up become one linear each, over the concatenated weights (each output element is the same
dot product as before, so the logits do not change: tests/test_lean_llama.py), and the forward
walks the layers itself. Quantization applies to the fused linears as to any other (the int8 and
4-bit layouts are per output row, so fusing rows changes no code). Other architectures run
transformers' own forward. Figures: benchmarks/RESULTS.md, "A lean Llama forward".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine_service.model import attention

ARCHITECTURE = "LlamaForCausalLM"


def supports(model: torch.nn.Module) -> bool:
    """Exactly transformers' Llama (subclasses and look-alikes may change the math)."""
    return type(model).__name__ == ARCHITECTURE and type(model).__module__.startswith("transformers.")


def _fused(*linears: torch.nn.Linear) -> torch.nn.Linear:
    """One nn.Linear whose output is the given linears' outputs side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias,
                            device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if has_bias:
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))
    return fused.requires_grad_(False)


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward: float32 statistics, the weight applied in the input's dtype."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb on one tensor (q and k heads together)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanLlama:
    """Call with (input_ids [1, T], position_ids [1, T], logits_to_keep [K], layout) -> logits [1, K, vocab].

    Takes the model over: its q/k/v and gate/up linears are replaced by fused ones, so transformers'
    own forward no longer runs on it."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        self.model = model
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.q_heads = config.num_attention_heads
        self.qk_width = (config.num_attention_heads + config.num_key_value_heads) * self.head_dim
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_proj = _fused(attn.q_proj, attn.k_proj, attn.v_proj)
            mlp.gate_up_proj = _fused(mlp.gate_proj, mlp.up_proj)
            del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, logits_to_keep: torch.Tensor,
                 layout: attention.StepLayout) -> torch.Tensor:
        base = self.model.model
        tokens = input_ids.shape[1]
        h = F.embedding(input_ids, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(h, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, T, D]: broadcast over heads
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.qkv_proj(_rms_norm(layer.input_layernorm, h))
            # q and k heads rotated together, then split: [1, heads, T, D] views, as transformers has them.
            qk = _rotate(qkv[..., :self.qk_width].view(1, tokens, -1, self.head_dim).transpose(1, 2), cos, sin)
            q, k = qk[:, :self.q_heads], qk[:, self.q_heads:]
            v = qkv[..., self.qk_width:].view(1, tokens, -1, self.head_dim).transpose(1, 2)
            out, _ = attention.paged_attention(attn, q, k, v, None, scaling=attn.scaling, layout=layout)
            h = h + attn.o_proj(out.reshape(1, tokens, -1))
            gate, up = mlp.gate_up_proj(_rms_norm(layer.post_attention_layernorm, h)).chunk(2, dim=-1)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        h = _rms_norm(base.norm, h)
        return self.model.lm_head(h[:, logits_to_keep])
