"""The lean Llama forward (engine_service/model/llama.py) computes transformers' logits bit for bit.

Two ModelRunners over copies of one model, one with the lean forward and one with transformers'
own, run the same steps: two prompts prefilled, then their decodes beside a third prompt whose first
block is shared with the first (a prefix-cache hit: a chunk after cached context), then three
decodes, then one alone. Every logits row must be equal, not close: the lean forward promises the
same math. With the native kernels the lean forward's residual add + RMSNorm is one native call that
sums the squares in another order (model/rms_norm.c), so there the rows must be close, and the
bit-for-bit runs use torch's kernels on both sides, or the other native kernels with torch's norm
(the kernel stays for what it earns: benchmarks/RESULTS.md, "A native residual add + RMSNorm").
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import llama, native
from engine_service.model.runner import ModelRunner
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK = 16
CPU = torch.device("cpu")


def runners(model: torch.nn.Module, dtype: torch.dtype, **options) -> tuple[ModelRunner, ModelRunner]:
    """(lean, transformers') runners over two copies of `model`."""
    reference = copy.deepcopy(model)
    lean = ModelRunner(model, CPU, dtype, BLOCK, 64, 256, **options)
    plain = ModelRunner(reference, CPU, dtype, BLOCK, 64, 256, lean_forward=False, **options)
    assert lean.lean is not None and plain.lean is None
    return lean, plain


def run_both(lean: ModelRunner, plain: ModelRunner, scheduled: ScheduledBatch, exact: bool) -> int:
    """One step on both; asserts every logits row is identical (or close) and returns how many there were."""
    step = scheduled.step_input()
    got, want = lean.run(step), plain.run(step)
    assert got.next_token.keys() == want.next_token.keys()
    for seq_id, row in want.next_token.items():
        if exact:
            assert torch.equal(got.next_token[seq_id], row), f"sequence {seq_id}"
        else:
            torch.testing.assert_close(got.next_token[seq_id].float(), row.float(), rtol=0.02, atol=0.05)
    return len(want.next_token)


def check_same_steps(lean: ModelRunner, plain: ModelRunner, vocab: int, exact: bool = True) -> None:
    g = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    a = RunnerSeq(0, prompt(21), block_table=[0, 1])
    b = RunnerSeq(1, prompt(9), block_table=[2])
    assert run_both(lean, plain, ScheduledBatch(prefill=[(a, 21), (b, 9)]), exact) == 2
    # Decodes beside a prompt that reuses a's first block (16 cached tokens) and prefills the rest.
    c = RunnerSeq(2, a.token_ids[:BLOCK] + prompt(6), num_cached=BLOCK, block_table=[0, 3])
    for seq, token in ((a, 5), (b, 7)):
        seq.token_ids.append(token)
        seq.num_cached = len(seq.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[a, b], prefill=[(c, 6)]), exact) == 3
    for seq in (a, b, c):
        seq.token_ids.append(11)
        seq.num_cached = len(seq.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[a, b, c]), exact) == 3
    b.token_ids.append(13)  # one sequence alone: the runner adds its padding row
    b.num_cached = len(b.token_ids) - 1
    assert run_both(lean, plain, ScheduledBatch(decode=[b]), exact) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_matches_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    config = tiny_config(attention_bias=True, mlp_bias=True)
    check_same_steps(*runners(tiny_in_memory(config, dtype), dtype, native_kernels=False), config.vocab_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_with_the_native_norm_stays_close_to_transformers(dtype: torch.dtype) -> None:
    if native.kernels() is None:
        pytest.skip("the native kernels cannot be built here")
    config = tiny_config(attention_bias=True, mlp_bias=True)
    lean, plain = runners(tiny_in_memory(config, dtype), dtype)
    assert all(layer.input_norm.native is not None for layer in lean.lean.layers)
    check_same_steps(lean, plain, config.vocab_size, exact=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_norm_is_the_only_kernel_that_leaves_transformers_bits(dtype: torch.dtype) -> None:
    """With the native int8 linears and decode attention on both sides and the lean forward's norms
    on torch (the benchmark's --torch-norm), the rows are transformers' bit for bit again."""
    if native.kernels() is None:
        pytest.skip("the native kernels cannot be built here")
    config = tiny_config(attention_bias=True, mlp_bias=True)
    lean, plain = runners(tiny_in_memory(config, dtype), dtype, quantization="int8")
    assert lean.int8_kernel == "native" and lean.decode_attention is not None
    lean.lean = llama.LeanLlama(lean.model, None)
    check_same_steps(lean, plain, config.vocab_size)


def test_lean_forward_fuses_projections_and_leaves_other_architectures_alone() -> None:
    model = tiny_in_memory(tiny_config(), torch.float32)
    ModelRunner(model, CPU, torch.float32, BLOCK, 64, 256)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj"), "the separate weights must be freed"
    assert attn.qkv_proj.out_features == 64 + 2 * 32 and mlp.gate_up_proj.out_features == 2 * 128
    other = tiny_in_memory(tiny_config("qwen2"), torch.float32)
    assert ModelRunner(other, CPU, torch.float32, BLOCK, 64, 256).lean is None


@pytest.mark.model
@pytest.mark.parametrize("quantization", ["none", "int4"])
@pytest.mark.usefixtures("one_torch_thread")
def test_lean_forward_matches_transformers_on_the_default_model(quantization: str) -> None:
    from engine_service.model.loader import load_model

    loaded = load_model(None, device="cpu", dtype="bfloat16")
    lean, plain = runners(loaded.model, loaded.dtype, quantization=quantization, native_kernels=False)
    check_same_steps(lean, plain, loaded.model.config.vocab_size)
