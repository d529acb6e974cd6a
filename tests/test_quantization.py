"""Low-bit linear weights (engine_service/model/linear.py): the kernels compute what the quantized
weights say, rows never change each other's results, the default applies only to bf16 on the CPU,
and on the real default model int8 and int4 stay close to full bf16 weights (greedy tokens and the
log-likelihood of a fixed text)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import goldens
import pytest
import torch
from conftest import STARTUP_TIMEOUT_S
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

from clients import EngineClient
from launcher.stack import Stack

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model.linear import (CPU_BF16_DEFAULT, INT4_GROUP, LOW_BIT_MAX_ROWS,
                                         NATIVE_INT8_MAX_ROWS_WITHOUT_BF16_GEMM, QUANTIZATIONS, RowGroups,
                                         Int4Linear, Int8Linear, Int8Panels, PackedLinear, int4_quantize, low_bit_max_rows,
                                         one_row_rounds_differently, packable, quantize_linears,
                                         resolve_quantization)
from engine_service.model import linear as linear_module
from engine_service.model import loader, native
from engine_service.model.loader import load_model
from engine_service.model.runner import ModelRunner

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

CPU = torch.device("cpu")


def linear(out_features: int = 96, in_features: int = 128, bias: bool = False) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)


def test_the_default_is_full_weights_except_for_bf16_on_the_cpu() -> None:
    assert resolve_quantization(None, CPU, torch.bfloat16) == CPU_BF16_DEFAULT == "int8"
    # --deterministic: the model's own weights, batch-invariant at every batch size for free.
    assert resolve_quantization(None, CPU, torch.bfloat16, deterministic=True) == "none"
    assert resolve_quantization("int8", CPU, torch.bfloat16, deterministic=True) == "int8"
    assert resolve_quantization(None, CPU, torch.float32) == "none"
    assert resolve_quantization(None, torch.device("cuda"), torch.bfloat16) == "none"
    assert resolve_quantization("int8", CPU, torch.float32) == "int8"
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("int4", torch.device("cuda"), torch.bfloat16)


def test_the_default_dtype_on_the_cpu_is_bf16_with_native_bf16_or_avx2(monkeypatch) -> None:
    """On AVX2 the linears compute bf16 rows in float32 and int8 runs on the native kernel, so bf16
    (and with it the int8 default) costs nothing there; older CPUs keep float32."""
    monkeypatch.setattr(loader, "cpu_has_native_bf16", lambda: False)
    for capability, dtype in (("AVX512", torch.bfloat16), ("AVX2", torch.bfloat16), ("DEFAULT", torch.float32)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability)
        assert loader.pick_dtype("auto", CPU) == dtype, capability
    assert loader.pick_dtype("float32", CPU) == torch.float32


def test_packed_linears_compute_bf16_rows_in_float32_where_onednn_has_no_bf16_kernel(monkeypatch) -> None:
    """An AVX2-only CPU has no oneDNN bf16 kernel (packing bf16 weights raised there and the engine
    did not start): the weights are packed as float32, and each output is rounded to bf16 once."""
    assert packable(torch.bfloat16) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(linear_module, "packable", lambda dtype: dtype == torch.float32)
    layer = linear(bias=True)
    packed = PackedLinear(layer.weight, layer.bias)
    assert packed.compute_dtype == torch.float32 and packed.bias.dtype == torch.float32
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    got = packed(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.bfloat16().float(), rtol=2 ** -8, atol=1e-6)


def test_int4_codes_hold_weights_already_on_a_4_bit_grid_exactly() -> None:
    """The default model's weights come from Q4_1 (w = d * q + m per group of 32): representable."""
    torch.manual_seed(1)
    groups = 4 * 64 // INT4_GROUP
    d = torch.rand(groups, 1) * 0.01 + 0.001
    m = -torch.rand(groups, 1) * 0.1
    q = torch.randint(0, 16, (groups, INT4_GROUP))
    q[:, 0], q[:, 1] = 0, 15  # each group spans the whole grid, as Q4_1 groups do
    weight = (d * q + m).view(4, 64).to(torch.bfloat16)
    codes, scales, zeros = int4_quantize(weight)
    back = ((codes.view(4, -1, INT4_GROUP) - 8) * scales[..., None] + zeros[..., None]).view(4, 64)
    step = scales.repeat_interleave(INT4_GROUP, dim=1)
    # Only the scale's and zero's own rounding to bf16 (a fraction of one step) remains.
    assert ((back - weight.float()).abs() <= 0.05 * step + 0.02 * weight.float().abs()).all()


@pytest.mark.parametrize("bias", [False, True])
def test_quantized_kernels_compute_their_dequantized_weights(bias: bool) -> None:
    source = linear(bias=bias)
    x = torch.randn(5, 3, source.in_features, dtype=torch.bfloat16)
    int8 = Int8Linear(source, None)
    int8_weight = int8.weight.float() * int8.scales.float()[:, None]
    codes, scales, zeros = int4_quantize(source.weight)
    int4_weight = ((codes.view(96, -1, INT4_GROUP) - 8) * scales[..., None] + zeros[..., None]).view(96, -1)
    for module, weight in ((int8, int8_weight), (Int4Linear(source, None), int4_weight)):
        expected = x.float() @ weight.t() + (0 if source.bias is None else source.bias.float())
        got = module(x)
        assert got.shape == (5, 3, 96) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), expected, rtol=0.02, atol=0.02)
        assert (weight - source.weight.float()).abs().max() < 0.1 * source.weight.float().abs().max()


def native_int8(source: torch.nn.Linear, rows: RowGroups | None) -> Int8Linear:
    kernel = native.kernels()
    if kernel is None:
        pytest.skip("the native kernels cannot be built here")
    return Int8Linear(source, rows, kernel)


LOW_BIT = {"int8": Int8Linear, "int8 native": native_int8, "int4": Int4Linear}


@pytest.mark.parametrize("kind", LOW_BIT)
def test_a_row_gets_the_same_bits_whatever_the_number_of_rows(kind: str) -> None:
    module = LOW_BIT[kind](linear(), None)
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    full = module(x)
    for rows in (1, 2, LOW_BIT_MAX_ROWS, LOW_BIT_MAX_ROWS + 1, 33):
        assert torch.equal(module(x[:rows]), full[:rows]), rows


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_a_step_that_keeps_no_logits_runs_with_every_weights_choice(quantization: str) -> None:
    """A prompt longer than the step budget: its first chunk keeps no logits row, so the lm_head
    gets zero rows (int4 and int8 once failed there, on every long prompt)."""
    config = tiny_config()
    runner = ModelRunner(tiny_in_memory(config, torch.bfloat16), CPU, torch.bfloat16, 16, 32, 256,
                         quantization=quantization)
    prompt = RunnerSeq(0, list(range(3, 43)), block_table=[0, 1, 2])
    first = runner.run(ScheduledBatch(prefill=[(prompt, 24)]).step_input())
    assert first.next_token == {}
    prompt.num_cached = 24
    rest = runner.run(ScheduledBatch(prefill=[(prompt, 16)]).step_input())
    assert rest.next_token[0].shape == (config.vocab_size,)


@pytest.mark.parametrize("kind", LOW_BIT)
def test_low_bit_linears_run_their_full_copy_for_the_groups_that_say_so(kind: str) -> None:
    source, rows = linear(), RowGroups()
    fast, deterministic = LOW_BIT[kind](source, rows), LOW_BIT[kind](source, None)
    # Where oneDNN has no bf16 GEMM, native int8's full path is its GEMM on packed panels instead.
    panels = kind == "int8 native" and not packable(torch.bfloat16)
    assert isinstance(fast.full, Int8Panels if panels else PackedLinear) and deterministic.full is None
    x = torch.randn(LOW_BIT_MAX_ROWS + 1, 128, dtype=torch.bfloat16)
    assert torch.equal(fast(x), deterministic(x))
    rows.set_for_step([(len(x), True)])  # one prompt segment
    if panels:  # the dot kernel's very weights and scales, summed in another order: bf16 rarely tells
        calls: list[int] = []
        full_forward = fast._full_forward
        fast._full_forward = lambda rows: calls.append(len(rows)) or full_forward(rows)
        fast(x)
        assert calls == [len(x)]
    else:  # the same weights through another kernel, so only rounding differs
        assert not torch.equal(fast(x), deterministic(x))
    torch.testing.assert_close(fast(x).float(), deterministic(x).float(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_the_native_int8_gemm_gives_each_row_its_bits_whatever_the_rows(dtype: torch.dtype, bias: bool) -> None:
    """Int8Panels (int8_matmul.c's GEMM): the dot kernel's weights and scales, rounded apart from it
    but alike for a row alone and among 200 (6-row tiles and 96-row blocks: every remainder)."""
    kernel = native.kernels()
    if kernel is None:
        pytest.skip("the native kernels cannot be built here")
    source = linear(out_features=100, in_features=192, bias=bias).to(dtype)  # 100: a partial last panel
    dot = Int8Linear(source, None, kernel)
    gemm = Int8Panels(kernel, dot.weight, dot.float_scales, dot.bias)
    x = torch.randn(200, 192, dtype=dtype)
    every = gemm(x)
    for first, rows in ((0, 1), (3, 5), (7, 6), (50, 7), (0, 96), (1, 97), (0, 200)):
        assert torch.equal(gemm(x[first:first + rows]), every[first:first + rows]), (first, rows)
    torch.testing.assert_close(every.float(), dot(x).float(), rtol=0.02, atol=0.02)
    assert gemm(x.view(4, 50, 192)).shape == (4, 50, 100)


@pytest.mark.parametrize("max_rows", [LOW_BIT_MAX_ROWS, NATIVE_INT8_MAX_ROWS_WITHOUT_BF16_GEMM])
def test_full_copies_run_for_prompt_segments_and_many_decode_rows(max_rows: int) -> None:
    groups = RowGroups(max_rows)
    groups.set_for_step([(1, False), (0, True), (2, True), (max_rows, True)])
    assert groups.bounds == [0, 1, 3, 3 + max_rows] and groups.full == [False, True, True], "empty groups drop"
    for decode_rows, full in ((max_rows, False), (max_rows + 1, True)):
        groups.set_for_step([(decode_rows, False)])
        assert groups.full == [full]
    deterministic = RowGroups(None)
    deterministic.set_for_step([(max_rows + 1, False), (5, True)])
    assert deterministic.full == [False, False] and not deterministic.keeps_full_copies


def test_each_group_is_computed_with_a_call_of_its_own() -> None:
    groups, calls = RowGroups(), []
    groups.set_for_step([(3, False), (4, True), (2, True)])
    x = torch.arange(9.0)[:, None]
    y = groups.apply(lambda rows, full: calls.append((len(rows), full)) or rows * 2, x)
    assert calls == [(3, False), (4, True), (2, True)] and torch.equal(y, x * 2)
    calls.clear()
    groups.apply(lambda rows, full: calls.append((len(rows), full)) or rows, x[:5])
    assert calls == [(5, True)], "rows that are not the step's: one call"


@pytest.mark.parametrize("bf16_gemm", [True, False])
def test_native_int8_keeps_bigger_steps_where_onednn_has_no_bf16_gemm(bf16_gemm: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On an AVX2-only CPU the full copies compute in float32 and lose to the native kernel up to
    64 rows; elsewhere, and on torch's int8 kernel, the copies take over past 8 rows."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: bf16_gemm)
    kernel = native.kernels()
    expected = LOW_BIT_MAX_ROWS if bf16_gemm else NATIVE_INT8_MAX_ROWS_WITHOUT_BF16_GEMM
    if kernel is not None:
        assert low_bit_max_rows(torch.bfloat16, kernel) == expected
    assert low_bit_max_rows(torch.bfloat16, None) == LOW_BIT_MAX_ROWS
    assert low_bit_max_rows(torch.float32, kernel) == LOW_BIT_MAX_ROWS  # oneDNN's float32 GEMM runs there


@pytest.mark.parametrize("quantization, deterministic, pads", [
    ("none", False, True), ("int8", False, False), ("int8", True, False), ("int4", False, False)])
def test_a_lone_row_is_padded_only_where_a_dense_kernel_would_round_it_differently(
        quantization: str, deterministic: bool, pads: bool) -> None:
    model = torch.nn.Sequential(linear(64, 64), linear(64, 64))
    assert one_row_rounds_differently(model)  # plain nn.Linear
    quantize_linears(model, quantization, None if deterministic else RowGroups())
    assert one_row_rounds_differently(model) is pads
    quantize_linears(mixed := torch.nn.Sequential(linear(64, 64), linear(10, 64)), "int4", RowGroups())
    assert one_row_rounds_differently(mixed)  # 10 outputs stay dense: padded


def test_quantize_linears_swaps_every_linear_and_the_tied_head_keeps_the_embedding() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(16, 64), linear(64, 64), linear(10, 64), linear(16, 64))
    model[3].weight = model[0].weight  # tied, like the default model's lm_head
    embedding = model.to(torch.bfloat16)[0].weight.detach().clone()
    assert quantize_linears(model, "int4") == 3
    assert isinstance(model[1], Int4Linear) and isinstance(model[3], Int4Linear)
    assert isinstance(model[2], PackedLinear)  # 10 outputs: not a shape the 4-bit kernel takes
    assert torch.equal(model[0].weight, embedding)


# ------------------------------------------------------------------ quality on the default model

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about dogs.",
    "Count from 1 to 10.",
    "What do bees make?",
    "Explain what a computer is.",
    "Give me three tips for staying healthy.",
    "Why is the sky blue?",
    "Tell me a short story about a cat.",
]
TEXT = ("The lighthouse stood at the edge of the cliff, its white paint faded by a hundred winters. Every "
        "evening the keeper climbed the spiral stairs, trimmed the wick and wound the clockwork that turned "
        "the lens, so that ships far out at sea could find their way past the rocks and into the harbour.")
NEW_TOKENS = 32
# Measured on the default model (benchmarks/RESULTS.md, "Step time and low-bit weights"): the share of
# greedy steps whose token matches full bf16 weights (teacher-forced on bf16's own continuation), and
# how far the mean log-likelihood per token of TEXT moves. The bounds leave about 2-3x the measured gap.
MIN_AGREEMENT = {"int8": 0.85, "int4": 0.75}  # measured: 0.938, 0.875
MAX_LOGLIK_SHIFT = {"int8": 0.02, "int4": 0.12}  # measured: 0.0064, 0.050 (nats per token)


def full_bf16_model():
    loaded = load_model(None, device="cpu", dtype="bfloat16")
    quantize_linears(loaded.model, "none")
    tok = loaded.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for p in PROMPTS]
    return loaded.model, tok, prompts


@pytest.fixture(scope="module")
def full() -> Iterator[tuple]:
    """The full-bf16 model and its greedy continuations (tests/golden/, `make goldens`). One thread: on
    a busy machine, torch's thread pool waits on preempted workers and runs these tests many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, tok, prompts = full_bf16_model()
    continuations = [entry["ids"] for entry in goldens.load("bf16_continuations", prompts)]
    yield model, tok, prompts, continuations
    torch.set_num_threads(threads)


def compute_goldens() -> dict[str, list[dict]]:
    """The full-bf16 model's greedy continuations of PROMPTS, for `make goldens` (tests/goldens.py)."""
    model, _, prompts = full_bf16_model()
    with torch.inference_mode():
        return {"bf16_continuations": [{"prompt_ids": ids, "ids": greedy(model, ids)} for ids in prompts]}


def greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         do_sample=False)
    return out[0, len(prompt):].tolist()


def mean_loglik(model: torch.nn.Module, ids: list[int]) -> float:
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return float(logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None]).mean())


@pytest.mark.model
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_low_bit_weights_stay_close_to_bf16(full, quantization: str) -> None:
    reference, tok, prompts, continuations = full
    loaded = load_model(None, device="cpu", dtype="bfloat16")
    quantize_linears(loaded.model, quantization)
    matched = total = 0
    with torch.inference_mode():
        for prompt, continuation in zip(prompts, continuations):
            logits = loaded.model(input_ids=torch.tensor([prompt + continuation])).logits[0]
            predicted = logits[len(prompt) - 1:-1].argmax(-1).tolist()
            matched += sum(p == c for p, c in zip(predicted, continuation))
            total += len(continuation)
        text_ids = tok(TEXT)["input_ids"]
        shift = abs(mean_loglik(loaded.model, text_ids) - mean_loglik(reference, text_ids))
    agreement = matched / total
    print(f"{quantization}: greedy agreement {agreement:.3f}, mean log-likelihood shift {shift:.4f}")
    assert agreement >= MIN_AGREEMENT[quantization]
    assert shift < MAX_LOGLIK_SHIFT[quantization]


@pytest.mark.model
def test_an_int4_deterministic_engine_answers_the_same_alone_and_batched() -> None:
    """The real engine process with --quantization int4 --deterministic: prompt chunks and decode
    batches of any size go through the 4-bit kernel, so batching changes nothing."""
    flags = ["--quantization", "int4", "--deterministic"]
    with Stack(engine_args=flags, startup_timeout=STARTUP_TIMEOUT_S) as stack, \
            EngineClient(stack.engine_address, timeout=120) as client:
        params = [{"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 24}
                  for p in PROMPTS]
        alone = [client.complete(**params[i]).text for i in (0, 1)]
        with ThreadPoolExecutor(len(params)) as pool:
            batched = [c.text for c in pool.map(lambda p: client.complete(**p), params)]
    assert all(alone) and batched[:2] == alone
