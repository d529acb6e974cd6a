"""The native kernels (engine_service/model/native.py, int8_matmul.c, decode_attention.c, rms_norm.c, simd.h):
they compute what the int8 weights and scales (and the paged cache) say, in bf16 and float32, for
any number of rows and output channels; a row's bits never depend on the other rows or on the
thread count; each is built once into the cache and refused, not miscompiled, where it cannot be
built. Each test runs on every build this CPU can run (AVX2, and AVX-512 where it has it)."""

from __future__ import annotations

import ctypes

import pytest
import torch
from model_configs import RUNNER_COMMON, RunnerSeq, tiny_in_memory
from transformers import LlamaConfig

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import native
from engine_service.model.linear import Int8Linear
from engine_service.model.runner import ModelRunner

CPU = torch.device("cpu")


def runnable_isas() -> list[str]:
    """The builds this CPU runs: an AVX-512 CPU runs the AVX2 build too."""
    try:
        isa = native.cpu_isa()
    except native.Unavailable:
        return []
    return ["AVX2", "AVX512"] if isa == "AVX512" else [isa]


def load(source, isa: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(native.build(source, isa)))
    except native.Unavailable as exc:  # no C compiler: the engine then keeps torch's kernels
        pytest.skip(f"the native kernels cannot be built here: {exc}")


ISAS = runnable_isas() or [pytest.param(None, marks=pytest.mark.skip(reason="needs x86-64 with AVX-512 or AVX2"))]


@pytest.fixture(scope="module", params=ISAS)
def kernel(request) -> native.Int8Matmul:
    return native.Int8Matmul(load(native.INT8_SOURCE, request.param))


def test_the_engine_gets_this_cpus_build() -> None:
    if not runnable_isas():
        pytest.skip("needs x86-64 with AVX-512 or AVX2")
    load(native.INT8_SOURCE, native.cpu_isa())  # skips where there is no C compiler
    assert native.int8_matmul() is not None and native.decode_attention() is not None


@pytest.mark.slow  # compiles every library from scratch
def test_every_build_compiles_on_any_x86_64(tmp_path, monkeypatch) -> None:
    """The container image builds them all (`python -m engine_service.model.native`), whatever the
    CPU that builds it."""
    if not runnable_isas():
        pytest.skip("needs x86-64 and a C compiler")
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    try:
        native.main()
    except native.Unavailable as exc:
        pytest.skip(f"no C compiler: {exc}")
    built = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "kernels").iterdir())
    assert built == ["decode_attention-avx2", "decode_attention-avx512", "int8_matmul-avx2", "int8_matmul-avx512", "rms_norm-avx2", "rms_norm-avx512"]


def quantized(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    scales = (w.abs().amax(dim=1) / 127).to(torch.bfloat16).float()
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


# bf16 rows with K a multiple of 32 take the vdpbf16ps path on CPUs with AVX512_BF16 (K 64, 576,
# 1536); other K (16, 48, 1552) and float32 rows take float32 FMAs.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m, k, n", [(1, 16, 1), (1, 576, 960), (2, 576, 37), (3, 1552, 64), (5, 64, 9),
                                      (8, 576, 576), (9, 128, 23), (17, 48, 50)])
def test_it_computes_the_dequantized_product(kernel: native.Int8Matmul, dtype: torch.dtype,
                                             m: int, k: int, n: int) -> None:
    weight, scales = quantized(n, k)
    x = torch.randn(m, k).to(dtype)
    got = kernel(x, weight, scales)
    expected = (x.double() @ weight.double().t()) * scales.double()
    assert got.shape == (m, n) and got.dtype == dtype
    # float32 sums, then one rounding to the output type
    tolerance = 2 ** -8 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=1e-5 * expected.abs().max().item())


def test_it_agrees_with_torchs_int8_kernel_up_to_the_last_bf16_bit(kernel: native.Int8Matmul) -> None:
    weight, scales = quantized(960, 576)
    x = torch.randn(4, 576, dtype=torch.bfloat16)
    ours = kernel(x, weight, scales).float()
    torchs = torch._weight_int8pack_mm(x, weight, scales.to(torch.bfloat16)).float()
    torch.testing.assert_close(ours, torchs, rtol=2 ** -7, atol=1e-6)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count(kernel: native.Int8Matmul) -> None:
    weight, scales = quantized(203, 1536)  # 203: a tail of channels past every block width
    x = torch.randn(19, 1536, dtype=torch.bfloat16)
    full = kernel(x, weight, scales)
    for rows in range(1, 19):
        assert torch.equal(kernel(x[:rows], weight, scales), full[:rows]), rows
        assert torch.equal(kernel(x[rows:rows + 1], weight, scales), full[rows:rows + 1]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(x, weight, scales), full)
    finally:
        torch.set_num_threads(threads)


def test_no_rows_give_an_empty_result(kernel: native.Int8Matmul) -> None:
    weight, scales = quantized(8, 32)
    assert kernel(torch.empty(0, 32, dtype=torch.bfloat16), weight, scales).shape == (0, 8)


def test_mismatched_rows_are_refused_not_read_past(kernel: native.Int8Matmul) -> None:
    weight, scales = quantized(8, 32)
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(2, 48, dtype=torch.bfloat16), weight, scales)
    with pytest.raises(ValueError, match="rows"):
        kernel(torch.randn(2, 32, dtype=torch.float16), weight, scales)


def test_int8_linears_run_it_where_it_supports_the_layer(kernel: native.Int8Matmul) -> None:
    torch.manual_seed(0)
    supported = Int8Linear(torch.nn.Linear(64, 24).to(torch.bfloat16), None, kernel)
    odd = Int8Linear(torch.nn.Linear(40, 24).to(torch.bfloat16), None, kernel)  # 40 inputs: not a multiple of 16
    assert supported.native is kernel and odd.native is None
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    dequantized = supported.weight.float() * supported.scales.float()[:, None]
    torch.testing.assert_close(supported(x).float(), x.float() @ dequantized.t() + supported.bias.float(),
                               rtol=0.02, atol=0.02)
    assert odd(torch.randn(3, 40, dtype=torch.bfloat16)).shape == (3, 24)


def test_the_library_is_built_once_into_the_cache(kernel: native.Int8Matmul, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    first = native.build(native.INT8_SOURCE, "AVX2")
    assert first.parent == tmp_path / "kernels" and first.exists()
    built_at = first.stat().st_mtime_ns
    assert native.build(native.INT8_SOURCE, "AVX2") == first and first.stat().st_mtime_ns == built_at
    assert list(first.parent.iterdir()) == [first]  # no scratch left behind


def test_a_missing_or_failing_compiler_makes_it_unavailable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.Unavailable, match="failed to run"):
        native.build(native.INT8_SOURCE, "AVX2")
    monkeypatch.setenv("CC", "false")
    with pytest.raises(native.Unavailable, match="exited"):
        native.build(native.INT8_SOURCE, "AVX2")
    assert not (tmp_path / "kernels").exists() or not list((tmp_path / "kernels").iterdir())


def test_a_prebuilt_library_needs_no_compiler(kernel: native.Int8Matmul, tmp_path, monkeypatch) -> None:
    """As in the container image, which builds the kernels (`python -m engine_service.model.native`)
    and ships without a compiler."""
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    built = native.build(native.INT8_SOURCE, "AVX2")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert native.build(native.INT8_SOURCE, "AVX2") == built


# ------------------------------------------------------------------ decode attention


@pytest.fixture(scope="module", params=ISAS)
def attend(request) -> native.DecodeAttention:
    return native.DecodeAttention(load(native.ATTENTION_SOURCE, request.param))


def paged_case(lens: list[int], q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
               block: int = 16, seed: int = 0):
    """A cache whose blocks are handed out shuffled, each sequence's table padded with block 0."""
    torch.manual_seed(seed)
    width = max(-(-n // block) for n in lens)
    blocks = torch.randperm(sum(-(-n // block) for n in lens) + 2)
    cache_k = torch.randn(len(blocks) * block, kv_heads, head_dim).to(dtype)
    cache_v = torch.randn(len(blocks) * block, kv_heads, head_dim).to(dtype)
    tables, taken = [], 0
    for n in lens:
        own = blocks[taken:taken + -(-n // block)].tolist()
        taken += len(own)
        tables.append(own + [0] * (width - len(own)))
    qkv = torch.randn(len(lens), q_heads + 2 * kv_heads, head_dim).to(dtype)
    query = qkv[:, :q_heads]  # a view with the fused projection's row stride, as the lean forward passes it
    return query, cache_k, cache_v, torch.tensor(tables).view(-1), torch.tensor(lens), width


def reference(query, cache_k, cache_v, ids, lens, width, window, scale, block=16):
    """float64 softmax attention of each row over its own gathered context."""
    out = []
    group = query.shape[1] // cache_k.shape[1]
    for row, n in enumerate(lens.tolist()):
        table = ids[row * width:(row + 1) * width]
        slots = (table[:, None] * block + torch.arange(block)).view(-1)[:n]
        first = max(0, n - window) if window else 0
        k = cache_k[slots[first:]].double().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = cache_v[slots[first:]].double().repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,nhd->hn", query[row].double(), k) * scale, dim=-1)
        out.append(torch.einsum("hn,nhd->hd", weights, v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(9, 3, 64), (4, 4, 32), (8, 1, 256), (6, 2, 16)])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_attention_matches_softmax_attention_over_each_context(
        attend: native.DecodeAttention, dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int,
        window: int | None) -> None:
    lens = [1, 17, 40, 129, 16]
    query, k, v, ids, lens_t, width = paged_case(lens, q_heads, kv_heads, head_dim, dtype)
    assert attend.supports(q_heads, kv_heads, head_dim, dtype)
    got = attend(query, k, v, ids, lens_t, 16, window, head_dim ** -0.5)
    expected = reference(query, k, v, ids, lens_t, width, window, head_dim ** -0.5)
    assert got.shape == (len(lens), q_heads, head_dim) and got.dtype == dtype
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance)


def test_decode_attention_gives_a_row_the_same_bits_in_any_batch(attend: native.DecodeAttention) -> None:
    lens = [5, 130, 33, 64, 200]
    query, k, v, ids, lens_t, width = paged_case(lens, 9, 3, 64, torch.bfloat16)
    batched = attend(query, k, v, ids, lens_t, 16, None, 0.125)
    for row in range(len(lens)):
        alone = attend(query[row:row + 1], k, v, ids[row * width:(row + 1) * width].clone(), lens_t[row:row + 1],
                       16, None, 0.125)
        assert torch.equal(alone, batched[row:row + 1]), row
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend(query, k, v, ids, lens_t, 16, None, 0.125), batched)
    finally:
        torch.set_num_threads(threads)


def test_decode_attention_refuses_what_it_cannot_compute(attend: native.DecodeAttention) -> None:
    assert not attend.supports(4, 2, 24, torch.bfloat16)  # head_dim not a multiple of 16
    assert not attend.supports(4, 2, 272, torch.bfloat16)  # past 256
    assert not attend.supports(4, 3, 32, torch.bfloat16)  # query heads not grouped evenly
    assert not attend.supports(4, 2, 32, torch.float16)
    query, k, v, ids, lens_t, _ = paged_case([3], 4, 2, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="against cache"):
        attend(query.float(), k, v, ids, lens_t, 16, None, 1.0)
    with pytest.raises(ValueError, match="int64"):
        attend(query, k, v, ids.int(), lens_t, 16, None, 1.0)


def test_decode_attention_takes_queries_of_any_layout(attend: native.DecodeAttention) -> None:
    """transformers' forward hands [heads, tokens, dim] transposed; a strided dim is copied first."""
    query, k, v, ids, lens_t, _ = paged_case([40, 7], 4, 2, 32, torch.bfloat16)
    expected = attend(query.contiguous(), k, v, ids, lens_t, 16, None, 0.2)
    heads_first = query.transpose(0, 1).contiguous().transpose(0, 1)
    dim_strided = query.transpose(1, 2).contiguous().transpose(1, 2)
    assert dim_strided.stride(-1) != 1
    for layout in (query, heads_first, dim_strided):
        assert torch.equal(attend(layout, k, v, ids, lens_t, 16, None, 0.2), expected)


def test_the_runner_attends_decode_rows_with_it(attend: native.DecodeAttention) -> None:
    """Wired in: every layer of a decode step calls the kernel, and the next token's logits match
    torch's gather-then-SDPA path within float32 rounding; --no-native-kernels keeps torch's path."""
    config = LlamaConfig(**RUNNER_COMMON)
    runners = {}
    for native_kernels in (True, False):
        runners[native_kernels] = ModelRunner(tiny_in_memory(config, torch.float32), CPU, torch.float32, 16, 16,
                                              256, native_kernels=native_kernels)
    assert runners[False].decode_attention is None
    calls = []
    runners[True].decode_attention = lambda *args: calls.append(1) or attend(*args)
    logits = {}
    for native_kernels, runner in runners.items():
        seq = RunnerSeq(0, list(range(3, 43)), block_table=[0, 1, 2])
        runner.run(ScheduledBatch(prefill=[(seq, 39)]), set())  # all but the last token, cached
        seq.num_cached = 39
        logits[native_kernels] = runner.run(ScheduledBatch(decode=[seq]), set()).next_token[0]
    assert len(calls) == config.num_hidden_layers
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=ISAS)
def add_norm(request) -> native.AddRmsNorm:
    return native.AddRmsNorm(load(native.NORM_SOURCE, request.param))


def torch_add_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The lean forward's torch path: h + delta, then LlamaRMSNorm as transformers computes it."""
    h = h + delta
    normed = torch.nn.functional.rms_norm(h.float(), h.shape[-1:], eps=eps).to(h.dtype)
    return h, weight * normed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, dim", [(1, 576), (5, 576), (3, 100), (40, 2048)])
def test_add_rms_norm_adds_in_place_and_normalizes_as_transformers(add_norm: native.AddRmsNorm, dtype: torch.dtype,
                                                                   rows: int, dim: int) -> None:
    torch.manual_seed(rows * dim)
    h, delta = (torch.randn(rows, dim) * 4).to(dtype), torch.randn(rows, dim).to(dtype)
    weight = torch.randn(dim).to(dtype)
    expected_h, expected = torch_add_norm(h, delta, weight, 1e-5)
    target = h.clone()
    got_h, got = add_norm(target, delta, weight, 1e-5)
    assert got_h.data_ptr() == target.data_ptr() and torch.equal(got_h, expected_h)  # the add rounds as torch's
    # Only the order of the sum of squares differs: at most the last bit of a bf16 output.
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
    h_before = h.clone()
    _, alone = add_norm(h, None, weight, 1e-5)
    assert torch.equal(h, h_before)  # no delta: h is only read
    torch.testing.assert_close(alone.float(), torch_add_norm(h, torch.zeros_like(h), weight, 1e-5)[1].float(),
                               rtol=tolerance, atol=tolerance)


def test_add_rms_norm_gives_a_row_the_same_bits_in_any_batch(add_norm: native.AddRmsNorm) -> None:
    h, delta, weight = torch.randn(64, 2048).bfloat16(), torch.randn(64, 2048).bfloat16(), torch.randn(2048).bfloat16()
    _, batched = add_norm(h.clone(), delta, weight, 1e-6)
    for row in (0, 17, 63):
        assert torch.equal(add_norm(h[row:row + 1].clone(), delta[row:row + 1], weight, 1e-6)[1], batched[row:row + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(add_norm(h.clone(), delta, weight, 1e-6)[1], batched)
    finally:
        torch.set_num_threads(threads)


def test_add_rms_norm_refuses_what_it_cannot_compute(add_norm: native.AddRmsNorm) -> None:
    h, weight = torch.randn(2, 64).bfloat16(), torch.randn(64).bfloat16()
    for bad in (
        (h, torch.randn(2, 64), weight),  # float32 delta on bf16 h
        (h, torch.randn(3, 64).bfloat16(), weight),
        (h, None, torch.randn(32).bfloat16()),
        (torch.randn(64, 2).bfloat16().t(), None, weight),  # not contiguous
        (h.half(), None, weight.half()),
    ):
        with pytest.raises(ValueError):
            add_norm(*bad, 1e-5)


def test_the_lean_forward_adds_and_normalizes_with_it() -> None:
    """Wired in: the lean Llama forward's norms run the native kernel where it builds, and torch's
    with --no-native-kernels."""
    config = LlamaConfig(**RUNNER_COMMON)
    on = ModelRunner(tiny_in_memory(config, torch.bfloat16), CPU, torch.bfloat16, 16, 16, 256)
    off = ModelRunner(tiny_in_memory(config, torch.bfloat16), CPU, torch.bfloat16, 16, 16, 256, native_kernels=False)
    norms = lambda runner: [runner.lean.norm] + [n for layer in runner.lean.layers  # noqa: E731
                                                 for n in (layer.input_norm, layer.post_attention_norm)]
    assert all(n.native is None for n in norms(off))
    if native.add_rms_norm() is None:
        pytest.skip("the native kernels cannot be built here")
    assert all(isinstance(n.native, native.AddRmsNorm) for n in norms(on))
