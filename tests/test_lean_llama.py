"""The lean Llama forward (engine_service/model/llama.py) computes transformers' logits bit for bit.

Two ModelRunners over copies of one model, one with the lean forward and one with transformers'
own, run the same steps: two prompts prefilled, then their decodes beside a third prompt whose first
block is shared with the first (a prefix-cache hit: a chunk after cached context), then three
decodes. Every logits row must be equal, not close: the lean forward promises the same math.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import llama
from engine_service.model.runner import ModelRunner

BLOCK = 16
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)


@dataclass
class Seq:
    """The fields ModelRunner reads from a Sequence."""

    seq_id: int
    token_ids: list[int]
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)


def tiny_model(config, dtype: torch.dtype) -> torch.nn.Module:
    """A seeded random model; the norms' weights random too (transformers starts them at one)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.3)
    return model


def runners(model: torch.nn.Module, dtype: torch.dtype, monkeypatch) -> tuple[ModelRunner, ModelRunner]:
    """(lean, transformers') runners over two copies of `model`."""
    reference = copy.deepcopy(model)
    lean = ModelRunner(model, torch.device("cpu"), dtype, BLOCK, 64, 256)
    with monkeypatch.context() as patch:
        patch.setattr(llama, "supports", lambda m: False)
        plain = ModelRunner(reference, torch.device("cpu"), dtype, BLOCK, 64, 256)
    assert lean.lean is not None and plain.lean is None
    return lean, plain


def run_both(lean: ModelRunner, plain: ModelRunner, scheduled: ScheduledBatch) -> int:
    """One step on both; asserts every logits row is identical and returns how many there were."""
    got, want = lean.run(scheduled, set()), plain.run(scheduled, set())
    assert got.next_token.keys() == want.next_token.keys()
    for seq_id, row in want.next_token.items():
        assert torch.equal(got.next_token[seq_id], row), f"sequence {seq_id}"
    return len(want.next_token)


def check_same_steps(lean: ModelRunner, plain: ModelRunner, vocab: int) -> None:
    g = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    a = Seq(0, prompt(21), block_table=[0, 1])
    b = Seq(1, prompt(9), block_table=[2])
    assert run_both(lean, plain, ScheduledBatch(prefill=[(a, 21), (b, 9)])) == 2
    # Decodes beside a prompt that reuses a's first block (16 cached tokens) and prefills the rest.
    c = Seq(2, a.token_ids[:BLOCK] + prompt(6), num_cached=BLOCK, block_table=[0, 3])
    for seq, token in ((a, 5), (b, 7)):
        seq.token_ids.append(token)
        seq.num_cached = len(seq.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[a, b], prefill=[(c, 6)])) == 3
    for seq in (a, b, c):
        seq.token_ids.append(11)
        seq.num_cached = len(seq.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[a, b, c])) == 3
    b.token_ids.append(13)  # one sequence alone: the runner adds its padding row
    b.num_cached = len(b.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[b])) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_matches_transformers_bit_for_bit(dtype: torch.dtype, monkeypatch) -> None:
    config = LlamaConfig(**TINY, attention_bias=True, mlp_bias=True)
    check_same_steps(*runners(tiny_model(config, dtype), dtype, monkeypatch), config.vocab_size)


def test_lean_forward_fuses_projections_and_leaves_other_architectures_alone() -> None:
    model = tiny_model(LlamaConfig(**TINY), torch.float32)
    ModelRunner(model, torch.device("cpu"), torch.float32, BLOCK, 64, 256)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj"), "the separate weights must be freed"
    assert attn.qkv_proj.out_features == 64 + 2 * 32 and mlp.gate_up_proj.out_features == 2 * 128
    other = tiny_model(Qwen2Config(**TINY), torch.float32)
    assert ModelRunner(other, torch.device("cpu"), torch.float32, BLOCK, 64, 256).lean is None


@pytest.mark.model
@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_lean_forward_matches_transformers_on_the_default_model(quantization: str, monkeypatch) -> None:
    from engine_service.model.loader import load_model

    loaded = load_model(None, device="cpu", dtype="bfloat16")
    lean = ModelRunner(loaded.model, loaded.device, loaded.dtype, BLOCK, 64, 256, quantization=quantization)
    reference = load_model(None, device="cpu", dtype="bfloat16").model
    with monkeypatch.context() as patch:
        patch.setattr(llama, "supports", lambda m: False)
        plain = ModelRunner(reference, loaded.device, loaded.dtype, BLOCK, 64, 256, quantization=quantization)
    check_same_steps(lean, plain, loaded.model.config.vocab_size)
