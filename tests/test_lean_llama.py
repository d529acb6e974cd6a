"""The lean Llama forward (engine_service/model/llama.py) computes transformers' logits bit for bit.

Two ModelRunners over copies of one model, one with the lean forward and one with transformers'
own, run the same steps: two prompts prefilled, then their decodes beside a third prompt whose first
block is shared with the first (a prefix-cache hit: a chunk after cached context), then three
decodes, then one alone. Every logits row must be equal, not close: the lean forward promises the
same math. With the native kernels the lean forward's residual add + RMSNorm is one native call that
sums the squares in another order (model/rms_norm.c), so there the rows must be close, and the
bit-for-bit runs use torch's kernels on both sides.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import native
from engine_service.model.runner import ModelRunner
from model_configs import RUNNER_COMMON, RunnerSeq, tiny_in_memory

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
    got, want = lean.run(scheduled, set()), plain.run(scheduled, set())
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
    config = LlamaConfig(**RUNNER_COMMON, attention_bias=True, mlp_bias=True)
    check_same_steps(*runners(tiny_in_memory(config, dtype), dtype, native_kernels=False), config.vocab_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_forward_with_the_native_norm_stays_close_to_transformers(dtype: torch.dtype) -> None:
    if native.add_rms_norm() is None:
        pytest.skip("the native kernels cannot be built here")
    config = LlamaConfig(**RUNNER_COMMON, attention_bias=True, mlp_bias=True)
    lean, plain = runners(tiny_in_memory(config, dtype), dtype)
    assert all(layer.input_norm.native is not None for layer in lean.lean.layers)
    check_same_steps(lean, plain, config.vocab_size, exact=False)


def test_lean_forward_fuses_projections_and_leaves_other_architectures_alone() -> None:
    model = tiny_in_memory(LlamaConfig(**RUNNER_COMMON), torch.float32)
    ModelRunner(model, CPU, torch.float32, BLOCK, 64, 256)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj"), "the separate weights must be freed"
    assert attn.qkv_proj.out_features == 64 + 2 * 32 and mlp.gate_up_proj.out_features == 2 * 128
    other = tiny_in_memory(Qwen2Config(**RUNNER_COMMON), torch.float32)
    assert ModelRunner(other, CPU, torch.float32, BLOCK, 64, 256).lean is None


@pytest.mark.model
@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_lean_forward_matches_transformers_on_the_default_model(quantization: str) -> None:
    from engine_service.model.loader import load_model

    loaded = load_model(None, device="cpu", dtype="bfloat16")
    lean, plain = runners(loaded.model, loaded.dtype, quantization=quantization, native_kernels=False)
    check_same_steps(lean, plain, loaded.model.config.vocab_size)


def native_and_lean_runners(model: torch.nn.Module, dtype: torch.dtype) -> tuple[ModelRunner, ModelRunner, list[int]]:
    """(runner whose decode steps run as one native call, runner on the lean forward's torch ops, the
    rows of each native call), over two copies of `model` with int8 weights on the native kernels."""
    if native.decode_layers() is None:
        pytest.skip("the native kernels cannot be built here")
    reference = copy.deepcopy(model)
    fused = ModelRunner(model, CPU, dtype, BLOCK, 64, 256, quantization="int8")
    lean = ModelRunner(reference, CPU, dtype, BLOCK, 64, 256, quantization="int8", native_decode_step=False)
    assert fused.native_decode_layers and not lean.native_decode_layers
    calls: list[int] = []
    step = fused.lean.decode_layers
    fused.lean.decode_layers = lambda h, *args: (calls.append(h.shape[0]), step(h, *args))
    return fused, lean, calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_in_one_native_call_match_the_lean_forward(dtype: torch.dtype) -> None:
    """decode_layers.c rounds where the lean forward rounds (only its SiLU's e^x may differ by an ulp)."""
    config = LlamaConfig(**RUNNER_COMMON)
    fused, lean, calls = native_and_lean_runners(tiny_in_memory(config, dtype), dtype)
    check_same_steps(fused, lean, config.vocab_size, exact=False)
    assert calls == [3, 1], "only the decode-only steps run as one native call"


def test_big_native_decode_steps_match_the_lean_forward_and_keep_rows_apart() -> None:
    """From decode_layers.c's GEMM_MIN_ROWS (16) rows, projections with packed panels (a CPU without
    oneDNN's bf16 GEMM: AVX2) run the GEMM: close to the lean forward's dot products, and a row's bits
    still ignore the other rows. Where oneDNN has a bf16 GEMM (AVX-512), steps of more than
    LOW_BIT_MAX_ROWS run the bf16 copies instead of the native step: the same must hold there."""
    config = LlamaConfig(**RUNNER_COMMON)
    fused, lean, calls = native_and_lean_runners(tiny_in_memory(config, torch.bfloat16), torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    seqs = [RunnerSeq(i, torch.randint(3, config.vocab_size, (5,), generator=g).tolist(), block_table=[i])
            for i in range(20)]
    assert run_both(fused, lean, ScheduledBatch(prefill=[(seq, 5) for seq in seqs]), exact=False) == 20
    for seq in seqs:
        seq.token_ids.append(7)
        seq.num_cached = 5
    assert run_both(fused, lean, ScheduledBatch(decode=seqs), exact=False) == 20
    whole = fused.run(ScheduledBatch(decode=seqs), set())
    part = fused.run(ScheduledBatch(decode=seqs[:17]), set())
    for seq in seqs[:17]:
        assert torch.equal(part.next_token[seq.seq_id], whole.next_token[seq.seq_id]), seq.seq_id
    # Which path a step of 20 rows takes is the code's choice per instruction set (linear.low_bit_max_rows).
    assert calls == ([20, 20, 17] if fused.full_weights.max_rows >= 20 else [])


def test_threads_splitting_a_steps_rows_give_each_row_the_same_bits() -> None:
    """From 2 x threads^2 rows, decode_layers.c gives each thread its own rows through every layer
    instead of splitting each matmul's channels. Where the native step takes 20 rows (AVX2: see
    linear.low_bit_max_rows), 20 rows (the GEMM side of GEMM_MIN_ROWS): 2 and 3 threads split the rows
    (evenly and not), 4 split the channels; and 9 rows (the dot kernel's side): 2 threads split the
    rows, 3 and 4 the channels. Where it takes at most 8 (AVX-512), 8 rows: 2 threads split the rows,
    3 and 4 the channels. 1 thread splits neither. Every row's logits are the same bits each way, and
    the thread count the engine set survives the step."""
    config = LlamaConfig(**RUNNER_COMMON)
    fused, _, calls = native_and_lean_runners(tiny_in_memory(config, torch.bfloat16), torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    seqs = [RunnerSeq(i, torch.randint(3, config.vocab_size, (3 + i % 12,), generator=g).tolist(), block_table=[i])
            for i in range(20)]
    fused.run(ScheduledBatch(prefill=[(seq, len(seq.token_ids)) for seq in seqs]), set())
    for seq in seqs:
        seq.token_ids.append(7)
        seq.num_cached = len(seq.token_ids) - 1
    row_counts = (20, 9) if fused.full_weights.max_rows >= 20 else (fused.full_weights.max_rows,)
    assert min(row_counts) >= 2 * 2 ** 2, "2 threads must split the rows of some step"
    threads = torch.get_num_threads()
    try:
        for rows in row_counts:
            steps = {}
            for count in (1, 2, 3, 4):
                torch.set_num_threads(count)
                steps[count] = fused.run(ScheduledBatch(decode=seqs[:rows]), set()).next_token
                assert torch.get_num_threads() == count
            for count in (2, 3, 4):
                for seq in seqs[:rows]:
                    assert torch.equal(steps[count][seq.seq_id], steps[1][seq.seq_id]), (rows, count, seq.seq_id)
    finally:
        torch.set_num_threads(threads)
    assert calls == [rows for rows in row_counts for _ in range(4)]


def test_the_native_decode_step_is_not_used_where_it_would_compute_differently() -> None:
    if native.decode_layers() is None:
        pytest.skip("the native kernels cannot be built here")
    config = LlamaConfig(**RUNNER_COMMON)
    # --deterministic: a decode row beside a prompt chunk takes the torch path, so alone it must too.
    assert not ModelRunner(tiny_in_memory(config, torch.float32), CPU, torch.float32, BLOCK, 64, 256,
                           quantization="int8", deterministic=True).native_decode_layers
    biased = LlamaConfig(**RUNNER_COMMON, attention_bias=True)
    assert not ModelRunner(tiny_in_memory(biased, torch.float32), CPU, torch.float32, BLOCK, 64, 256,
                           quantization="int8").native_decode_layers
    assert not ModelRunner(tiny_in_memory(config, torch.float32), CPU, torch.float32, BLOCK, 64, 256,
                           quantization="none").native_decode_layers


@pytest.mark.model
def test_native_decode_steps_match_the_lean_forward_on_the_default_model() -> None:
    from engine_service.model.loader import load_model

    loaded = load_model(None, device="cpu", dtype="bfloat16")
    fused, lean, calls = native_and_lean_runners(loaded.model, loaded.dtype)
    check_same_steps(fused, lean, loaded.model.config.vocab_size, exact=False)
    assert calls == [3, 1]
