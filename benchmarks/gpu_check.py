"""`make gpu-check`: what a machine with one NVIDIA GPU must show, in under 10 minutes, with every
result under one folder (default benchmarks/out/gpu-check/):

1. env.txt: nvidia-smi, torch and CUDA versions.
2. tests.xml / tests.log: tests/test_gpu.py (greedy equality with transformers on the same device,
   batch invariance, the prefix cache) and the stack tests through the shim, every engine on cuda.
3. bench.md / bench.json: a short `benchmarks.bench` run (shim and gRPC, conc 1 and 32).

Without a CUDA GPU it says so and exits 1: nothing was checked.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The model tier's stack tests: chat and completions through the shim, batching, the prefix cache.
STACK_TESTS = ["tests/test_gpu.py", "tests/test_stack_chat.py", "tests/test_stack_completions.py",
               "tests/test_engine_batching.py", "tests/test_prefix_cache_stack.py", "tests/test_fidelity_tools.py"]
BENCH_ARGS = ["--skip-peer", "--concurrency", "1,32", "--repeats", "1", "--min-seconds", "15", "--prefix-samples", "3"]


def run(command: list[str], log: Path, env: dict[str, str]) -> int:
    print("+", " ".join(command), f"> {log}", flush=True)
    with log.open("w") as out:
        return subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "out" / "gpu-check")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU here (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
              "nothing was checked", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout if shutil.which("nvidia-smi") else ""
    (args.out / "env.txt").write_text(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                      f"{torch.cuda.get_device_name(0)}\n\n{smi}")
    env = {**os.environ, "CONDUIT_DEVICE": "cuda"}  # every engine the tests start, explicitly on the GPU
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15",
                 f"--junitxml={args.out / 'tests.xml'}", *STACK_TESTS], args.out / "tests.log", env)
    bench = run([sys.executable, "-m", "benchmarks.bench", *BENCH_ARGS, "--engine-args=--device cuda",
                 "--json", str(args.out / "bench.json"), "--markdown"], args.out / "bench.md", env)
    print(f"gpu-check: tests {'passed' if tests == 0 else 'FAILED'}, bench {'done' if bench == 0 else 'FAILED'}; "
          f"results in {args.out}")
    return 0 if tests == bench == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
