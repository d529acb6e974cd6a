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

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine_service.model import attention

if TYPE_CHECKING:
    from engine_service.model.native import Kernels

ARCHITECTURE = "LlamaForCausalLM"


def supports(model: torch.nn.Module) -> bool:
    """Exactly transformers' Llama (subclasses and look-alikes may change the math)."""
    return type(model).__name__ == ARCHITECTURE and type(model).__module__.startswith("transformers.")


def _fused(*linears: torch.nn.Linear) -> torch.nn.Linear:
    """One nn.Linear whose output is the given linears' outputs side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = linears[0].bias is not None
    # On the meta device: a real one would fill its weights at random first (~0.75 s an engine start).
    fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    fused.weight = torch.nn.Parameter(weight, requires_grad=False)
    if has_bias:
        fused.bias = torch.nn.Parameter(torch.cat([lin.bias.detach() for lin in linears]), requires_grad=False)
    return fused


class _Norm:
    """LlamaRMSNorm.forward: float32 statistics, the weight applied in the input's dtype. F.rms_norm
    computes the same float32 ops in one call (tested bit for bit against transformers). With
    `native` (model/native.py's rms_norm.c) one call adds the residual and normalizes; it sums the
    squares in another order, so the lean forward then matches transformers closely, not bit for bit."""

    def __init__(self, norm: torch.nn.Module, native: Kernels | None = None) -> None:
        self.weight, self.eps = norm.weight, norm.variance_epsilon
        self.native = None if native is None else native.add_rms_norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native(x, None, self.weight, self.eps)
        return self.weight * F.rms_norm(x.to(torch.float32), x.shape[-1:], eps=self.eps).to(x.dtype)

    def after_adding(self, h: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + delta, this norm of it); the native kernel writes the sum into h."""
        if self.native is not None:
            return h, self.native(h, delta, self.weight, self.eps)
        h = h + delta
        return h, self(h)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb on one tensor (q and k heads together): x * cos + rotate_half(x) * sin,
    where rotate_half(x) * sin = [-x2 * s1, x1 * s2] is computed as roll(x) * [-s1, s2] (the same bits:
    negating a factor rounds a product alike)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def fused_parts(config: object) -> dict[str, list[tuple[str, int]]]:
    """Each fused linear's pieces (fuse_projections) and their output sizes, in order."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    return {"qkv_proj": [("q_proj", config.num_attention_heads * head_dim), ("k_proj", kv), ("v_proj", kv)],
            "gate_up_proj": [("gate_proj", config.intermediate_size), ("up_proj", config.intermediate_size)]}


def fuse_projections(model: torch.nn.Module) -> None:
    """Replace each layer's q/k/v and gate/up linears by one fused linear each (before quantizing:
    the fused linears are then quantized like the rest). transformers' own forward no longer runs
    on the model afterwards."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _fused(attn.q_proj, attn.k_proj, attn.v_proj)
        mlp.gate_up_proj = _fused(mlp.gate_proj, mlp.up_proj)
        del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj


class LeanLlama:
    """Call with (input_ids [1, T], position_ids [1, T], logits_to_keep [K], layout) -> logits [1, K, vocab];
    `final_hidden` gives the same rows before lm_head (the final norm's output: what embeddings pool).

    Built over a model whose projections are fused (`fuse_projections`) and whose linears are final
    (quantized or not): it holds each layer's modules as plain calls and its norms' weights at hand,
    because nn.Module's __call__ and __getattr__ cost ~1-2 us each, some 0.3 ms of a batch-1 step
    (no hooks are used on them). With `native_norm`, each residual add and the norm after it are one
    native call (see _Norm)."""

    def __init__(self, model: torch.nn.Module, native_norm: Kernels | None = None) -> None:
        config = model.config
        self.model = model
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.q_heads = config.num_attention_heads
        self.qk_heads = config.num_attention_heads + config.num_key_value_heads
        self.layers = [_Layer(layer, native_norm) for layer in model.model.layers]
        self.norm = _Norm(model.model.norm, native_norm)
        # Each residual add comes with the norm after it: the next layer's input norm, or the final one.
        self.next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        self.lm_head = model.lm_head.forward

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, logits_to_keep: torch.Tensor,
                 layout: attention.StepLayout) -> torch.Tensor:
        return self.lm_head(self.final_hidden(input_ids, position_ids, logits_to_keep, layout)).unsqueeze(0)

    def final_hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, rows_to_keep: torch.Tensor,
                     layout: attention.StepLayout) -> torch.Tensor:
        """[K, hidden]: the final norm's output at the kept rows."""
        base = self.model.model
        tokens, head_dim, q_heads, qk_heads = input_ids.shape[1], self.head_dim, self.q_heads, self.qk_heads
        h = F.embedding(input_ids[0], base.embed_tokens.weight)  # [T, hidden] all the way: no reshapes
        cos, sin = base.rotary_emb(h, position_ids)
        cos, sin = cos[0].unsqueeze(1), _signed_sin(sin[0]).unsqueeze(1)  # [T, 1, D]: broadcast over heads
        normed = self.layers[0].input_norm(h)
        for layer, next_norm in zip(self.layers, self.next_norms):
            # [T, heads, D] views of the fused projection: q and k heads rotated together, then split.
            qkv = layer.qkv_proj(normed).view(tokens, -1, head_dim)
            qk = _rotate(qkv[:, :qk_heads], cos, sin)
            out = attention.attend_packed(layer.index, qk[:, :q_heads], qk[:, q_heads:], qkv[:, qk_heads:],
                                          layout, layer.scaling)
            h, normed = layer.post_attention_norm.after_adding(h, layer.o_proj(out.reshape(tokens, -1)))
            gate, up = layer.gate_up_proj(normed).chunk(2, dim=-1)
            h, normed = next_norm.after_adding(h, layer.down_proj(layer.act_fn(gate) * up))
        return normed[rows_to_keep]


class _Layer:
    """One decoder layer's parts, the modules' forward methods taken out."""

    def __init__(self, layer: torch.nn.Module, native_norm: Kernels | None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.index, self.scaling = attn.layer_idx, attn.scaling
        self.input_norm = _Norm(layer.input_layernorm, native_norm)
        self.post_attention_norm = _Norm(layer.post_attention_layernorm, native_norm)
        self.qkv_proj, self.o_proj = attn.qkv_proj.forward, attn.o_proj.forward
        self.gate_up_proj, self.down_proj = mlp.gate_up_proj.forward, mlp.down_proj.forward
        self.act_fn = mlp.act_fn.forward
