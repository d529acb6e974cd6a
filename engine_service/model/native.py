"""Native CPU kernels: C sources next to this file, compiled on first use and loaded with ctypes.

- int8_matmul.c: an int8 weight-only matmul that streams the weights at ~1.5x the speed of
  torch._weight_int8pack_mm on a batch-1 decode step.
- decode_attention.c: decode attention read in place from the paged KV cache, where torch's path
  gathers each sequence's blocks and then runs SDPA.
- rms_norm.c: the residual add and the RMSNorm after it in one call, where the lean Llama forward
  ran ~10 small torch ops.

They need x86-64 with AVX-512 or AVX2 (simd.h holds the vector code for both; each kernel is built
for the one this CPU has), and a C compiler with OpenMP (`cc`, or $CC) to build them: each shared
library is built once per source, instruction set and flags into the cache folder
(CONDUIT_CACHE_DIR/kernels, ~1 s) and reused after; `python -m engine_service.model.native` builds
them all ahead (the container image does, then needs no compiler). Where one cannot be built or loaded, its getter returns None
and the log says why once, and torch's kernels run instead: slower, never wrong.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from engine_service.model.loader import cache_dir

log = logging.getLogger(__name__)

INT8_SOURCE = Path(__file__).with_name("int8_matmul.c")
ATTENTION_SOURCE = Path(__file__).with_name("decode_attention.c")
NORM_SOURCE = Path(__file__).with_name("rms_norm.c")
SOURCES = (INT8_SOURCE, ATTENTION_SOURCE, NORM_SOURCE)
SIMD_HEADER = Path(__file__).with_name("simd.h")
# -fopenmp links libgomp, which resolves to the copy torch has loaded: one thread pool for both.
CFLAGS = ("-O3", "-std=gnu11", "-fopenmp", "-shared", "-fPIC")
# Per instruction set, by torch's name for the CPU's capability. -mavx512bf16 only lets
# int8_matmul.c use vdpbf16ps, which it does after checking the CPU has it.
ISA_FLAGS = {
    "AVX512": ("-mavx512f", "-mfma", "-mavx512bf16"),
    "AVX2": ("-mavx2", "-mfma", "-mf16c"),
}
LANES = 16  # the kernels' granularity of K and of head_dim (LANES in the C sources), on either build
MAX_HEAD_DIM = 256  # decode_attention.c's MAX_CHUNKS * LANES
DTYPES = (torch.bfloat16, torch.float32)


def panel_channels(library: ctypes.CDLL) -> int:
    """Output channels per panel of int8_matmul.c's GEMM (PANEL: two vectors, so it follows the build)."""
    library.conduit_int8_panel.restype = ctypes.c_int
    return library.conduit_int8_panel()


class Int8Matmul:
    """rows [M, K] (bf16 or float32) x int8 weight [N, K] -> [M, N] in rows' dtype, scaled per output
    channel by float32 `scales` [N]. Two kernels: dot products over the weights as they are (`bind`,
    a few rows), and a GEMM over the weights packed in panels (`pack`, then `bind_gemm`: many rows)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        signature = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._fn, self._gemm = library.conduit_int8_matmul, library.conduit_int8_gemm
        for fn in (self._fn, self._gemm):
            fn.argtypes, fn.restype = signature, ctypes.c_int
        self._pack = library.conduit_int8_pack
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self._pack.restype = None
        self.panel = panel_channels(library)

    @staticmethod
    def supports(weight: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether this kernel can run a linear with these int8 weights on activations of `dtype`."""
        return (weight.device.type == "cpu" and weight.dtype == torch.int8 and weight.dim() == 2
                and weight.is_contiguous() and weight.shape[1] % LANES == 0 and dtype in DTYPES)

    def __call__(self, rows: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return self.bind(weight, scales)(rows)

    def bind(self, weight: torch.Tensor, scales: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """rows -> this call's result with these weights and scales, their pointers and sizes taken once
        (the closure holds the tensors, so they live as long as it does)."""
        n, k = weight.shape
        return self._bound(self._fn, weight, n, k, scales)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The weights [N, K] in the GEMM's panels (N rounded up to whole panels, zeros past N)."""
        n, k = weight.shape
        packed = torch.empty(-(-n // self.panel) * self.panel * k, dtype=torch.int8)
        self._pack(weight.data_ptr(), n, k, packed.data_ptr())
        return packed

    def bind_gemm(self, packed: torch.Tensor, n: int, k: int, scales: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """As `bind`, on weights from `pack`: rows -> [M, N]."""
        return self._bound(self._gemm, packed, n, k, scales)

    @staticmethod
    def _bound(fn, weight: torch.Tensor, n: int, k: int, scales: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        w, s = weight.data_ptr(), scales.data_ptr()

        def matmul(rows: torch.Tensor) -> torch.Tensor:
            if rows.dtype not in DTYPES or rows.shape[-1] != k:
                raise ValueError(f"int8 matmul: rows {tuple(rows.shape)} {rows.dtype} against weight [{n}, {k}]")
            rows = rows.contiguous()
            m = rows.shape[0]
            out = torch.empty(m, n, dtype=rows.dtype)
            if m and fn(rows.data_ptr(), rows.dtype == torch.bfloat16, m, k, w, s, out.data_ptr(), n):
                raise MemoryError("int8 matmul: no memory for its scratch rows")
            return out

        matmul.keep_alive = (weight, scales)
        return matmul


class DecodeAttention:
    """attend(query [rows, q_heads, head_dim], one layer's k/v cache [slots, kv_heads, head_dim],
    block_ids [rows * width], lens [rows], ...) -> [rows, q_heads, head_dim]: decode_attention.c."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.conduit_decode_attention
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                             ctypes.c_int, ctypes.c_void_p]
        self._fn.restype = ctypes.c_int

    @staticmethod
    def supports(q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether the kernel can serve a model with these heads in this dtype (CPU tensors)."""
        return dtype in DTYPES and head_dim % LANES == 0 and head_dim <= MAX_HEAD_DIM and q_heads % kv_heads == 0

    def __call__(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: torch.Tensor,
                 lens: torch.Tensor, block_size: int, window: int | None, scale: float) -> torch.Tensor:
        rows, q_heads, head_dim = query.shape
        if query.dtype != k_cache.dtype or head_dim != k_cache.shape[2]:
            raise ValueError(f"decode attention: query {tuple(query.shape)} {query.dtype} against cache "
                             f"{tuple(k_cache.shape)} {k_cache.dtype}")
        if block_ids.dtype != torch.int64 or lens.dtype != torch.int64 or lens.shape != (rows,):
            raise ValueError("decode attention: block ids and lengths must be int64, one length per row")
        if query.stride(-1) != 1:  # rows and heads may be strided; each head's values must be contiguous
            query = query.contiguous()
        out = torch.empty(rows, q_heads, head_dim, dtype=query.dtype)
        if rows and self._fn(query.data_ptr(), query.stride(0), query.stride(1), k_cache.data_ptr(),
                             v_cache.data_ptr(), block_ids.data_ptr(), block_ids.numel() // rows, lens.data_ptr(),
                             rows, q_heads, k_cache.shape[1], head_dim, block_size, window or 0, scale,
                             query.dtype == torch.bfloat16, out.data_ptr()):
            raise MemoryError("decode attention: no memory for its scratch scores")
        return out


class AddRmsNorm:
    """(h [rows, dim], delta [rows, dim] or None, weight [dim], eps) -> (h, out [rows, dim]): h + delta
    written into h, and LlamaRMSNorm of it (rms_norm.c). bf16 or float32, all alike."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.conduit_add_rms_norm
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
        self._fn.restype = None

    def __call__(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        rows, dim = h.shape
        operands = (h, weight) if delta is None else (h, delta, weight)
        if (h.dtype not in DTYPES or any(t.dtype != h.dtype or t.device.type != "cpu" or not t.is_contiguous()
                                         for t in operands)
                or weight.shape != (dim,) or (delta is not None and delta.shape != h.shape)):
            raise ValueError(f"add_rms_norm: h {tuple(h.shape)} {h.dtype}, delta "
                             f"{None if delta is None else (tuple(delta.shape), delta.dtype)}, weight "
                             f"{tuple(weight.shape)} {weight.dtype}: contiguous CPU tensors of one dtype expected")
        out = torch.empty_like(h)
        self._fn(h.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(), rows, dim, eps,
                 h.dtype == torch.bfloat16, out.data_ptr())
        return h, out


@functools.cache
def int8_matmul() -> Int8Matmul | None:
    """The native int8 matmul, built on the first call; None where it is not available."""
    library = _library(INT8_SOURCE)
    return None if library is None else Int8Matmul(library)


@functools.cache
def decode_attention() -> DecodeAttention | None:
    """The native decode attention, built on the first call; None where it is not available."""
    library = _library(ATTENTION_SOURCE)
    return None if library is None else DecodeAttention(library)


@functools.cache
def add_rms_norm() -> AddRmsNorm | None:
    """The native residual add + RMSNorm, built on the first call; None where it is not available."""
    library = _library(NORM_SOURCE)
    return None if library is None else AddRmsNorm(library)


def _library(source: Path) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(build(source, cpu_isa())))
    except Unavailable as exc:
        log.info("%s is unavailable, torch's kernels run instead: %s", source.name, exc)
    except OSError as exc:  # dlopen
        log.warning("%s failed to load, torch's kernels run instead: %s", source.name, exc)
    return None


class Unavailable(RuntimeError):
    """This machine cannot build or run the native kernels."""


def cpu_isa() -> str:
    """The instruction set (a key of ISA_FLAGS) to build for on this CPU; Unavailable if none fits."""
    capability = torch.backends.cpu.get_cpu_capability()
    if platform.machine() not in ("x86_64", "AMD64") or capability not in ISA_FLAGS:
        raise Unavailable(f"needs an x86-64 CPU with AVX-512 or AVX2 (this is {platform.machine()}, {capability})")
    return capability


def build(source: Path, isa: str) -> Path:
    """The shared library of `source` for `isa`, compiled into the cache unless there already (the
    name holds a hash of the sources and the flags, so an image can ship them prebuilt and need no
    compiler)."""
    flags = (*CFLAGS, *ISA_FLAGS[isa])
    texts = [path.read_text() for path in (source, SIMD_HEADER)]
    key = hashlib.sha256("\0".join([*texts, *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{source.stem}-{isa.lower()}-{key}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise Unavailable("no C compiler (cc, gcc or $CC) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target, then renamed: engines starting together never load a half-written file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        _run([compiler, *flags, str(source), "-o", str(built)])
        os.replace(built, target)
    log.info("built %s with %s", target, compiler)
    return target


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{command[0]} failed to run: {exc}") from exc
    if done.returncode:
        raise Unavailable(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")


def main() -> None:
    """Build every kernel for every instruction set into the cache (container images run this at
    build time: the CPU that runs the image may differ from the one that built it), a compiler
    per core at once."""
    jobs = [(source, isa) for source in SOURCES for isa in ISA_FLAGS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
        for target in pool.map(lambda job: build(*job), jobs):
            print(target)


if __name__ == "__main__":
    main()
