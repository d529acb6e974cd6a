"""The native kernels (engine_service/model/native.py, native_ops.cpp, int8_matmul.c, decode_attention.c,
rms_norm.c, simd.h), bound as torch ops: they compute what the int8 weights and scales (and the paged
cache) say, in bf16 and float32, for any number of rows and output channels; a row's bits never
depend on the other rows or on the thread count; the ops refuse what the C code cannot compute; each
build is built once into the cache and refused, not miscompiled, where it cannot be built.

Each kernel test runs on every build this CPU executes (AVX512_BF16, AVX512 and AVX2 on a CPU with
avx512_bf16; fewer elsewhere), which are the builds that ship here (native.runnable_isas): so every
instruction-set path that ships is executed, including int8_matmul.c's vdpbf16ps path (bf16 rows
with K a multiple of 32 on the AVX512_BF16 build) and its float32 path (every other case). The
builds come from the cache (`make test` builds them first), so these tests pay for no compile."""

from __future__ import annotations

import pytest
import torch
from conftest import torch_threads
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import native
from engine_service.model.linear import Int8Linear
from engine_service.model.runner import ModelRunner

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

CPU = torch.device("cpu")
ISAS = native.runnable_isas() or [pytest.param(None, marks=pytest.mark.skip(reason="needs x86-64 with AVX-512 or AVX2"))]


def load(isa: str) -> native.Kernels:
    try:
        return native.load(isa)
    except native.Unavailable as exc:  # no compiler: the engine then keeps torch's kernels
        pytest.skip(f"the native kernels cannot be built here: {exc}")


@pytest.fixture(scope="module", params=ISAS)
def ops(request) -> native.Kernels:
    return load(request.param)


def test_the_engine_gets_the_best_build_this_cpu_runs() -> None:
    if not native.runnable_isas():
        pytest.skip("needs x86-64 with AVX-512 or AVX2")
    best = load(native.runnable_isas()[0])
    assert native.kernels() is best


def test_the_engine_falls_back_to_a_lesser_build_it_can_have(monkeypatch) -> None:
    """An image built on an AVX2 machine ships only that build; an AVX-512 CPU without a compiler
    loads it rather than torch's kernels."""
    monkeypatch.setattr(native, "runnable_isas", lambda: ["AVX512_BF16", "AVX2"])

    def load(isa: str) -> str:
        if isa != "AVX2":
            raise native.Unavailable("no compiler")
        return "the AVX2 build"

    monkeypatch.setattr(native, "load", load)
    native.kernels.cache_clear()
    try:
        assert native.kernels() == "the AVX2 build"
        monkeypatch.setattr(native, "runnable_isas", lambda: ["AVX512_BF16"])
        native.kernels.cache_clear()
        assert native.kernels() is None
    finally:
        native.kernels.cache_clear()  # the real one again, for the tests after


@pytest.mark.parametrize("capability, bf16, builds", [
    ("AVX512", True, ["AVX512_BF16", "AVX512", "AVX2"]), ("AVX512", False, ["AVX512", "AVX2"]),
    ("AVX2", False, ["AVX2"]), ("DEFAULT", False, [])])
def test_only_the_builds_a_cpu_executes_are_built_there(capability: str, bf16: bool, builds: list[str],
                                                        monkeypatch) -> None:
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    assert native.runnable_isas() == builds
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    assert native.runnable_isas() == []


def test_the_prebuild_makes_every_build_this_cpu_runs(capsys) -> None:
    """`python -m engine_service.model.native`, as the container image and `make test` run it (here
    the builds are in the cache already: it only names them)."""
    if not native.runnable_isas():
        pytest.skip("needs x86-64 with AVX-512 or AVX2")
    try:
        native.main()
    except SystemExit as exc:  # no compiler
        pytest.skip(str(exc))
    built = [line.rsplit("/", 1)[1].rsplit("-", 1)[0] for line in capsys.readouterr().out.split()]
    assert built == [f"conduit_ops-{isa.lower()}" for isa in native.runnable_isas()]


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
def test_it_computes_the_dequantized_product(ops: native.Kernels, dtype: torch.dtype, m: int, k: int,
                                             n: int) -> None:
    weight, scales = quantized(n, k)
    x = torch.randn(m, k).to(dtype)
    got = ops.int8_matmul(x, weight, scales)
    expected = (x.double() @ weight.double().t()) * scales.double()
    assert got.shape == (m, n) and got.dtype == dtype
    # float32 sums, then one rounding to the output type
    tolerance = 2 ** -8 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=1e-5 * expected.abs().max().item())


def test_it_agrees_with_torchs_int8_kernel_up_to_the_last_bf16_bit(ops: native.Kernels) -> None:
    weight, scales = quantized(960, 576)
    x = torch.randn(4, 576, dtype=torch.bfloat16)
    ours = ops.int8_matmul(x, weight, scales).float()
    torchs = torch._weight_int8pack_mm(x, weight, scales.to(torch.bfloat16)).float()
    torch.testing.assert_close(ours, torchs, rtol=2 ** -7, atol=1e-6)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count(ops: native.Kernels) -> None:
    weight, scales = quantized(203, 1536)  # 203: a tail of channels past every block width
    x = torch.randn(19, 1536, dtype=torch.bfloat16)
    kernel = lambda rows: ops.int8_matmul(rows, weight, scales)  # noqa: E731
    with torch_threads(2):
        full = kernel(x)
    for rows in range(1, 19):  # on one thread (conftest.py), as the rest
        assert torch.equal(kernel(x[:rows]), full[:rows]), rows
        assert torch.equal(kernel(x[rows:rows + 1]), full[rows:rows + 1]), rows
    assert torch.equal(kernel(x), full)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m, k, n", [(1, 64, 1), (5, 576, 37), (13, 48, 64), (200, 192, 100)])
def test_the_gemm_on_packed_panels_computes_the_dequantized_product(ops: native.Kernels, dtype: torch.dtype, m: int,
                                                                    k: int, n: int) -> None:
    weight, scales = quantized(n, k)
    packed = ops.int8_pack(weight)
    x = torch.randn(m, k).to(dtype)
    got = ops.int8_gemm(x, packed, scales, n)
    expected = (x.double() @ weight.double().t()) * scales.double()
    assert got.shape == (m, n) and got.dtype == dtype
    tolerance = 2 ** -8 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=1e-5 * expected.abs().max().item())
    assert torch.equal(ops.int8_gemm(x[:1], packed, scales, n), got[:1])  # a row alone: the same bits


def test_no_rows_give_an_empty_result(ops: native.Kernels) -> None:
    weight, scales = quantized(8, 32)
    assert ops.int8_matmul(torch.empty(0, 32, dtype=torch.bfloat16), weight, scales).shape == (0, 8)
    assert ops.int8_gemm(torch.empty(0, 32), ops.int8_pack(weight), scales, 8).shape == (0, 8)


def test_mismatched_operands_are_refused_not_read_past(ops: native.Kernels) -> None:
    weight, scales = quantized(8, 32)
    for rows in (torch.randn(2, 48, dtype=torch.bfloat16), torch.randn(2, 32, dtype=torch.float16),
                 torch.randn(2, 2, 32)):
        with pytest.raises(ValueError, match="rows"):
            ops.int8_matmul(rows, weight, scales)
    x = torch.randn(2, 32)
    for bad_weight, bad_scales in ((weight.float(), scales), (weight, scales[:4]), (weight, scales.bfloat16()),
                                   (weight.t(), scales), (weight[:, :24].contiguous(), scales)):
        with pytest.raises(ValueError):
            ops.int8_matmul(x, bad_weight, bad_scales)
    packed = ops.int8_pack(weight)
    for n in (0, 8 + packed.shape[2]):  # not the channels the panels hold
        with pytest.raises(ValueError, match="int8_pack"):
            ops.int8_gemm(x, packed, scales, n)


def test_int8_linears_run_it_where_it_supports_the_layer(ops: native.Kernels) -> None:
    torch.manual_seed(0)
    supported = Int8Linear(torch.nn.Linear(64, 24).to(torch.bfloat16), None, ops)
    odd = Int8Linear(torch.nn.Linear(40, 24).to(torch.bfloat16), None, ops)  # 40 inputs: not a multiple of 16
    assert supported.native is ops and odd.native is None
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    dequantized = supported.weight.float() * supported.scales.float()[:, None]
    torch.testing.assert_close(supported(x).float(), x.float() @ dequantized.t() + supported.bias.float(),
                               rtol=0.02, atol=0.02)
    assert odd(torch.randn(3, 40, dtype=torch.bfloat16)).shape == (3, 24)


def test_a_build_is_made_once_into_the_cache_and_then_needs_no_compiler(ops: native.Kernels, monkeypatch) -> None:
    """As in the container image, which builds the kernels (`python -m engine_service.model.native`)
    and ships without a compiler."""
    built = native.build(ops.isa)  # the fixture built it: from the cache
    assert built.parent == native.cache_dir() / "kernels" and built.exists()
    built_at = built.stat().st_mtime_ns
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", "")
    assert native.build(ops.isa) == built and built.stat().st_mtime_ns == built_at
    assert not [p for p in built.parent.iterdir() if p.is_dir()]  # no scratch left behind


def test_a_missing_or_failing_compiler_makes_it_unavailable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.Unavailable, match="failed to run"):
        native.build("AVX2")
    monkeypatch.setenv("CC", "false")
    with pytest.raises(native.Unavailable, match="exited"):
        native.build("AVX2")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC")
    with pytest.raises(native.Unavailable, match="no compiler"):
        native.build("AVX2")
    assert not (tmp_path / "kernels").exists() or not list((tmp_path / "kernels").iterdir())


@pytest.mark.parametrize("name", ["int8_matmul", "int8_pack", "int8_gemm", "decode_attention", "add_rms_norm"])
def test_the_ops_schemas_and_fake_functions_hold(name: str) -> None:
    """What torch.compile relies on: each op's schema (add_rms_norm declares that it writes h) and
    its fake function's output against the real one's."""
    if native.kernels() is None:
        pytest.skip("the native kernels cannot be built here")
    kernels = native.kernels()
    weight, scales = quantized(40, 64)
    query, k, v, ids, lens, _ = paged_case([3, 20], 4, 2, 32, torch.bfloat16)
    h = torch.randn(3, 64, dtype=torch.bfloat16)
    args = {"int8_matmul": (torch.randn(3, 64, dtype=torch.bfloat16), weight, scales),
            "int8_pack": (weight,),
            "int8_gemm": (torch.randn(3, 64), kernels.int8_pack(weight), scales, 40),
            "decode_attention": (query, k, v, ids, lens, 16, 0, 0.5),
            "add_rms_norm": (h, torch.randn_like(h), torch.randn(64, dtype=torch.bfloat16), 1e-5)}[name]
    torch.library.opcheck(getattr(kernels, name), args, test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------------ decode attention


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
        ops: native.Kernels, dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int,
        window: int | None) -> None:
    lens = [1, 17, 40, 129, 16]
    query, k, v, ids, lens_t, width = paged_case(lens, q_heads, kv_heads, head_dim, dtype)
    assert native.Kernels.supports_attention(q_heads, kv_heads, head_dim, dtype)
    got = ops.decode_attention(query, k, v, ids, lens_t, 16, window or 0, head_dim ** -0.5)
    expected = reference(query, k, v, ids, lens_t, width, window, head_dim ** -0.5)
    assert got.shape == (len(lens), q_heads, head_dim) and got.dtype == dtype
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance)


def test_decode_attention_gives_a_row_the_same_bits_in_any_batch(ops: native.Kernels) -> None:
    lens = [5, 130, 33, 64, 200]
    query, k, v, ids, lens_t, width = paged_case(lens, 9, 3, 64, torch.bfloat16)
    with torch_threads(2):
        batched = ops.decode_attention(query, k, v, ids, lens_t, 16, 0, 0.125)
    for row in range(len(lens)):  # on one thread (conftest.py), as the rest
        alone = ops.decode_attention(query[row:row + 1], k, v, ids[row * width:(row + 1) * width].clone(),
                                     lens_t[row:row + 1], 16, 0, 0.125)
        assert torch.equal(alone, batched[row:row + 1]), row
    assert torch.equal(ops.decode_attention(query, k, v, ids, lens_t, 16, 0, 0.125), batched)


def test_decode_attention_refuses_what_it_cannot_compute(ops: native.Kernels) -> None:
    supports = native.Kernels.supports_attention
    assert not supports(4, 2, 24, torch.bfloat16)  # head_dim not a multiple of 16
    assert not supports(4, 2, 272, torch.bfloat16)  # past 256
    assert not supports(4, 3, 32, torch.bfloat16)  # query heads not grouped evenly
    assert not supports(4, 2, 32, torch.float16)
    query, k, v, ids, lens_t, _ = paged_case([3, 20], 4, 2, 32, torch.bfloat16)
    attend = lambda *args: ops.decode_attention(*args, 16, 0, 1.0)  # noqa: E731
    with pytest.raises(ValueError, match="against cache"):
        attend(query.float(), k, v, ids, lens_t)
    with pytest.raises(ValueError, match="int64"):
        attend(query, k, v, ids.int(), lens_t)
    with pytest.raises(ValueError, match="past its"):  # longer than its block table
        attend(query, k, v, ids, torch.tensor([3, 40]))
    with pytest.raises(ValueError, match="names block"):  # a block past the cache
        attend(query, k, v, torch.tensor([99, 0, 1, 2]), lens_t)
    with pytest.raises(ValueError, match="head_dim"):
        attend(query[..., :24], k[..., :24].contiguous(), v[..., :24].contiguous(), ids, lens_t)


def test_decode_attention_takes_queries_of_any_layout(ops: native.Kernels) -> None:
    """transformers' forward hands [heads, tokens, dim] transposed; a strided dim is copied first."""
    query, k, v, ids, lens_t, _ = paged_case([40, 7], 4, 2, 32, torch.bfloat16)
    attend = lambda q: ops.decode_attention(q, k, v, ids, lens_t, 16, 0, 0.2)  # noqa: E731
    expected = attend(query.contiguous())
    heads_first = query.transpose(0, 1).contiguous().transpose(0, 1)
    dim_strided = query.transpose(1, 2).contiguous().transpose(1, 2)
    assert dim_strided.stride(-1) != 1
    for layout in (query, heads_first, dim_strided):
        assert torch.equal(attend(layout), expected)


def test_the_runner_attends_decode_rows_with_it(ops: native.Kernels) -> None:
    """Wired in: every layer of a decode step calls the kernel, and the next token's logits match
    torch's gather-then-SDPA path within float32 rounding; --no-native-kernels keeps torch's path."""
    config = tiny_config()
    runners = {}
    for native_kernels in (True, False):
        runners[native_kernels] = ModelRunner(tiny_in_memory(config, torch.float32), CPU, torch.float32, 16, 16,
                                              256, native_kernels=native_kernels)
    assert runners[False].decode_attention is None
    calls = []
    runners[True].decode_attention = lambda *args: calls.append(1) or ops.decode_attention(*args)
    logits = {}
    for native_kernels, runner in runners.items():
        seq = RunnerSeq(0, list(range(3, 43)), block_table=[0, 1, 2])
        runner.run(ScheduledBatch(prefill=[(seq, 39)]).step_input())  # all but the last token, cached
        seq.num_cached = 39
        logits[native_kernels] = runner.run(ScheduledBatch(decode=[seq]).step_input()).next_token[0]
    assert len(calls) == config.num_hidden_layers
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)


def torch_add_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The lean forward's torch path: h + delta, then LlamaRMSNorm as transformers computes it."""
    h = h + delta
    normed = torch.nn.functional.rms_norm(h.float(), h.shape[-1:], eps=eps).to(h.dtype)
    return h, weight * normed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, dim", [(1, 576), (5, 576), (3, 100), (40, 2048)])
def test_add_rms_norm_adds_in_place_and_normalizes_as_transformers(ops: native.Kernels, dtype: torch.dtype,
                                                                   rows: int, dim: int) -> None:
    torch.manual_seed(rows * dim)
    h, delta = (torch.randn(rows, dim) * 4).to(dtype), torch.randn(rows, dim).to(dtype)
    weight = torch.randn(dim).to(dtype)
    expected_h, expected = torch_add_norm(h, delta, weight, 1e-5)
    target = h.clone()
    got = ops.add_rms_norm(target, delta, weight, 1e-5)
    assert torch.equal(target, expected_h)  # added in place, rounded as torch's add
    # Only the order of the sum of squares differs: at most the last bit of a bf16 output.
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
    h_before = h.clone()
    alone = ops.add_rms_norm(h, None, weight, 1e-5)
    assert torch.equal(h, h_before)  # no delta: h is only read
    torch.testing.assert_close(alone.float(), torch_add_norm(h, torch.zeros_like(h), weight, 1e-5)[1].float(),
                               rtol=tolerance, atol=tolerance)


def test_add_rms_norm_gives_a_row_the_same_bits_in_any_batch(ops: native.Kernels) -> None:
    h, delta, weight = torch.randn(64, 2048).bfloat16(), torch.randn(64, 2048).bfloat16(), torch.randn(2048).bfloat16()
    with torch_threads(2):
        batched = ops.add_rms_norm(h.clone(), delta, weight, 1e-6)
    for row in (0, 17, 63):  # on one thread (conftest.py), as the rest
        alone = ops.add_rms_norm(h[row:row + 1].clone(), delta[row:row + 1], weight, 1e-6)
        assert torch.equal(alone, batched[row:row + 1])
    assert torch.equal(ops.add_rms_norm(h.clone(), delta, weight, 1e-6), batched)


def test_add_rms_norm_refuses_what_it_cannot_compute(ops: native.Kernels) -> None:
    h, weight = torch.randn(2, 64).bfloat16(), torch.randn(64).bfloat16()
    for bad in (
        (h, torch.randn(2, 64), weight),  # float32 delta on bf16 h
        (h, torch.randn(3, 64).bfloat16(), weight),
        (h, None, torch.randn(32).bfloat16()),
        (torch.randn(64, 2).bfloat16().t(), None, weight),  # not contiguous
        (h.half(), None, weight.half()),
    ):
        with pytest.raises(ValueError):
            ops.add_rms_norm(*bad, 1e-5)


def test_the_lean_forward_adds_and_normalizes_with_it() -> None:
    """Wired in: the lean Llama forward's norms run the native kernel where it builds, and torch's
    with --no-native-kernels."""
    config = tiny_config()
    on = ModelRunner(tiny_in_memory(config, torch.bfloat16), CPU, torch.bfloat16, 16, 16, 256)
    off = ModelRunner(tiny_in_memory(config, torch.bfloat16), CPU, torch.bfloat16, 16, 16, 256, native_kernels=False)
    norms = lambda runner: [runner.lean.norm] + [n for layer in runner.lean.layers  # noqa: E731
                                                 for n in (layer.input_norm, layer.post_attention_norm)]
    assert all(n.native is None for n in norms(off))
    if native.kernels() is None:
        pytest.skip("the native kernels cannot be built here")
    assert all(n.native is native.kernels().add_rms_norm for n in norms(on))
