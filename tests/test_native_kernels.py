"""The native int8 kernel (engine_service/model/native.py, int8_matmul.c): it computes what the int8
weights and scales say, in bf16 and float32, for any number of rows and output channels; a row's
bits never depend on the other rows or on the thread count; it is built once into the cache and
refused, not miscompiled, where it cannot be built."""

from __future__ import annotations

import pytest
import torch

from engine_service.model import native
from engine_service.model.linear import Int8Linear


@pytest.fixture(scope="module")
def kernel() -> native.Int8Matmul:
    built = native.int8_matmul()
    if built is None:  # the reason is in the log; the int8 linears then keep torch's kernel
        pytest.skip("the native int8 kernel cannot be built here (needs x86-64 AVX-512 and a C compiler)")
    return built


def quantized(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    scales = (w.abs().amax(dim=1) / 127).to(torch.bfloat16).float()
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


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
    first = native.build(native.INT8_SOURCE)
    assert first.parent == tmp_path / "kernels" and first.exists()
    built_at = first.stat().st_mtime_ns
    assert native.build(native.INT8_SOURCE) == first and first.stat().st_mtime_ns == built_at
    assert list(first.parent.iterdir()) == [first]  # no scratch left behind


def test_a_missing_or_failing_compiler_makes_it_unavailable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path))
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        with pytest.raises(native.Unavailable, match="AVX-512"):
            native.build(native.INT8_SOURCE)
        return
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.Unavailable, match="failed to run"):
        native.build(native.INT8_SOURCE)
    monkeypatch.setenv("CC", "false")
    with pytest.raises(native.Unavailable, match="exited"):
        native.build(native.INT8_SOURCE)
