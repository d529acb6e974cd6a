"""Native CPU kernels, C sources next to this file, bound as torch ops (torch.library).

Each kernel stays because it earns its keep on the default model's decode steps (int8 weights;
benchmarks/RESULTS.md, "Native kernels"):
- int8_matmul.c: the int8 linears (weights streamed with prefetching; vdpbf16ps on the AVX512_BF16
  build), and a GEMM over the same weights packed in panels for many rows where oneDNN has no bf16
  GEMM; 1.3-1.8x a decode step at 1-8 rows against torch._weight_int8pack_mm.
- decode_attention.c: decode attention read in place from the paged KV cache, where torch's path
  gathers each sequence's blocks and then runs SDPA; 1.2-1.25x a step at 1-32 rows.
- rms_norm.c: the residual add and the RMSNorm after it in one call, where the lean Llama forward
  runs ~10 small torch ops; 1.1-1.3x a decode step at 1 row, 1.1x at 8, 1.05-1.1x at 32 (re-measured
  for issue 41).

Binding: native_ops.cpp registers them with TORCH_LIBRARY as typed ops that check every shape,
dtype and index the C code reads, so callers pass tensors (`kernels().int8_matmul(rows, weight,
scales)`, i.e. torch.ops.conduit_<build>.int8_matmul), torch.compile sees them (with the fake
functions registered below), and no structure is mirrored by hand. A C++ op rather than a Python
`torch.library.custom_op` over the C functions, because a decode step makes ~200 of these calls:
a C++ op costs ~3 us a call from Python, ctypes with its checks in Python cost ~7 us, and a Python
custom op ~23 us: ~3.5 ms of a ~10 ms batch-1 step, half of what the kernels earn (RESULTS.md). native_ops.cpp includes
only <torch/library.h> and ATen's Tensor, not <torch/extension.h> (no pybind11: ~13 s of compiler
time instead of ~45), and is built here with the compiler directly, with
torch.utils.cpp_extension's include and library paths, rather than by cpp_extension.load, which
needs ninja and a compiler at every start even when the library is built: a container image
ships the library built and no compiler.

Builds ("instruction sets"): one library per build this CPU can execute, and only those, so that
every build that ships here is executed by the tests here (tests/test_native_kernels.py checks each
against torch): AVX512_BF16 (AVX-512 with vdpbf16ps), AVX512, AVX2 (simd.h holds the vector code
for AVX-512 and AVX2). The engine loads the best it can have. Each op namespace is named by its
build (conduit_avx512_bf16, conduit_avx512, conduit_avx2), so all of them load in one process.
Each library is built once per sources, flags and torch version into the cache folder
(CONDUIT_CACHE_DIR/kernels; ~20 s of compiler time a build, `cc` or $CC for the C, `c++` or $CXX
for the C++, with OpenMP) and reused after; `python -m engine_service.model.native` builds this CPU's ahead
(the container image does, and `make test` before the tests, so that no test pays for a build).
Where none can be built or loaded, `kernels()` returns None, the log says why once, and torch's
kernels run instead: slower, never wrong.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.utils import cpp_extension

from engine_service.model.cache_dir import cache_dir

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
KERNEL_SOURCES = (HERE / "int8_matmul.c", HERE / "decode_attention.c", HERE / "rms_norm.c")
OPS_SOURCE = HERE / "native_ops.cpp"
HEADERS = (HERE / "simd.h", HERE / "kernels.h")
# -fopenmp links libgomp, which resolves to the copy torch has loaded: one thread pool for both.
CFLAGS = ("-O3", "-std=gnu11", "-fopenmp", "-fPIC")
# native_ops.cpp holds only argument checks: no instruction-set flags (a library of a build this
# CPU cannot run must still load without faulting, for a clear refusal).
CXXFLAGS = ("-O2", "-std=c++20", "-fPIC", "-shared", "-fopenmp")
# Per build, best first: the C flags. -mavx512bf16 lets int8_matmul.c use vdpbf16ps.
ISA_FLAGS = {
    "AVX512_BF16": ("-mavx512f", "-mfma", "-mavx512bf16"),
    "AVX512": ("-mavx512f", "-mfma"),
    "AVX2": ("-mavx2", "-mfma", "-mf16c"),
}
LANES = 16  # the kernels' granularity of K and of head_dim, on every build
MAX_HEAD_DIM = 256  # decode_attention.c's MAX_CHUNKS * LANES
DTYPES = (torch.bfloat16, torch.float32)


class Unavailable(RuntimeError):
    """This machine cannot build or run the native kernels."""


class Kernels:
    """One build's ops, as OpOverloads (the cheapest call from Python); see native_ops.cpp:

    int8_matmul(rows [M, K], weight int8 [N, K], scales float32 [N]) -> [M, N] in rows' dtype
    int8_pack(weight [N, K]) -> panels; int8_gemm(rows, panels, scales, N) -> as int8_matmul
    decode_attention(query [rows, q_heads, D], k_cache, v_cache [slots, kv_heads, D], block_ids
        [rows * width] int64, lens [rows] int64, block_size, window (0: none), scale) -> [rows, q_heads, D]
    add_rms_norm(h [rows, dim], delta or None, weight [dim], eps) -> norm of h (+ delta, written into h)
    """

    def __init__(self, isa: str) -> None:
        ops = getattr(torch.ops, namespace(isa))
        self.isa = isa
        self.int8_matmul = ops.int8_matmul.default
        self.int8_pack = ops.int8_pack.default
        self.int8_gemm = ops.int8_gemm.default
        self.decode_attention = ops.decode_attention.default
        self.add_rms_norm = ops.add_rms_norm.default

    @staticmethod
    def supports_int8(weight: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether int8_matmul can run a linear with these int8 weights on activations of `dtype`."""
        return (weight.device.type == "cpu" and weight.dtype == torch.int8 and weight.dim() == 2
                and weight.is_contiguous() and weight.shape[1] % LANES == 0 and dtype in DTYPES)

    @staticmethod
    def supports_attention(q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
        """Whether decode_attention can serve a model with these heads in this dtype (CPU tensors)."""
        return dtype in DTYPES and head_dim % LANES == 0 and head_dim <= MAX_HEAD_DIM and q_heads % kv_heads == 0


def namespace(isa: str) -> str:
    return f"conduit_{isa.lower()}"


def runnable_isas() -> list[str]:
    """The builds this CPU executes, best first (an AVX-512 CPU runs the AVX2 build too)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    capability = torch.backends.cpu.get_cpu_capability()
    isas = []
    if capability == "AVX512" and torch.cpu._is_avx512_bf16_supported():
        isas.append("AVX512_BF16")
    if capability == "AVX512":
        isas.append("AVX512")
    if capability in ("AVX512", "AVX2"):
        isas.append("AVX2")
    return isas


@functools.cache
def kernels() -> Kernels | None:
    """The best build this CPU runs that can be had (built on the first call, or prebuilt: an image
    built on an AVX2 machine ships only the AVX2 build, which an AVX-512 CPU without a compiler
    then loads); None where none is available."""
    isas = runnable_isas()
    if not isas:
        log.info("native kernels unavailable, torch's kernels run instead: they need an x86-64 CPU with AVX-512 "
                 "or AVX2 (this is %s, %s)", platform.machine(), torch.backends.cpu.get_cpu_capability())
        return None
    for isa in isas:
        try:
            return load(isa)
        except Unavailable as exc:
            log.info("native %s build unavailable: %s", isa, exc)
        except OSError as exc:  # dlopen
            log.warning("native %s build failed to load: %s", isa, exc)
    log.info("native kernels unavailable, torch's kernels run instead")
    return None


@functools.cache
def load(isa: str) -> Kernels:
    """`isa`'s build, built unless in the cache, loaded, with its ops' fake functions registered."""
    torch.ops.load_library(str(build(isa)))
    _register_fakes(namespace(isa))
    return Kernels(isa)


def _register_fakes(ns: str) -> None:
    """Output shapes for torch.compile's fake tensors (the ops' CPU kernels read data)."""
    ops = getattr(torch.ops, ns)
    panel = ops.int8_panel()

    @torch.library.register_fake(f"{ns}::int8_matmul")
    def _(rows, weight, scales):
        return rows.new_empty(rows.shape[0], weight.shape[0])

    @torch.library.register_fake(f"{ns}::int8_pack")
    def _(weight):
        return weight.new_empty(-(-weight.shape[0] // panel), weight.shape[1], panel)

    @torch.library.register_fake(f"{ns}::int8_gemm")
    def _(rows, packed, scales, n):
        return rows.new_empty(rows.shape[0], n)

    @torch.library.register_fake(f"{ns}::decode_attention")
    def _(query, k_cache, v_cache, block_ids, lens, block_size, window, scale):
        return query.new_empty(query.shape)

    @torch.library.register_fake(f"{ns}::add_rms_norm")
    def _(h, delta, weight, eps):
        return torch.empty_like(h)


def build(isa: str) -> Path:
    """The ops library of `isa`'s build, compiled into the cache unless there already (the name
    holds a hash of the sources, the flags and torch's version, so an image can ship it prebuilt
    and need no compiler)."""
    if isa not in ISA_FLAGS:
        raise Unavailable(f"no build {isa!r}; builds: {', '.join(ISA_FLAGS)}")
    texts = [path.read_text() for path in (*KERNEL_SOURCES, OPS_SOURCE, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, *CFLAGS, *CXXFLAGS, *ISA_FLAGS[isa], torch.__version__]).encode())
    target = cache_dir() / "kernels" / f"conduit_ops-{isa.lower()}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cc = _compiler("CC", "cc", "gcc")
    cxx = _compiler("CXX", "c++", "g++")
    target.parent.mkdir(parents=True, exist_ok=True)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    libraries = [arg for path in cpp_extension.library_paths() for arg in (f"-L{path}", f"-Wl,-rpath,{path}")]
    # Built beside the target, then renamed: engines starting together never load a half-written file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        objects = []
        for source in KERNEL_SOURCES:
            objects.append(str(Path(scratch) / f"{source.stem}.o"))
            _run([cc, *CFLAGS, *ISA_FLAGS[isa], "-c", str(source), "-o", objects[-1]])
        built = Path(scratch) / target.name
        _run([cxx, *CXXFLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DCONDUIT_OPS={namespace(isa)}", *includes,
              str(OPS_SOURCE), *objects, *libraries, "-lc10", "-ltorch_cpu", "-o", str(built)])
        os.replace(built, target)
    log.info("built %s", target)
    return target


def _compiler(variable: str, *names: str) -> str:
    found = os.environ.get(variable) or next(filter(None, map(shutil.which, names)), None)
    if not found:
        raise Unavailable(f"no compiler ({', '.join(names)} or ${variable}) on PATH")
    return found


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{command[0]} failed to run: {exc}") from exc
    if done.returncode:
        raise Unavailable(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")


def main() -> None:
    """Build every build this CPU runs into the cache, at once (container images and `make test` run
    this ahead: an engine on a CPU that runs none of these builds runs torch's kernels)."""
    isas = runnable_isas()
    if not isas:  # nothing to build: not an error (the engine runs torch's kernels)
        print(f"no native build runs on this CPU ({platform.machine()}, {torch.backends.cpu.get_cpu_capability()})")
        return
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(isas)) as pool:
            for target in pool.map(build, isas):
                print(target)
    except Unavailable as exc:
        raise SystemExit(f"native kernels not built: {exc}") from exc


if __name__ == "__main__":
    main()
