"""Time one engine step on the default model: decode at batch 1, 8 and 32 and a 512-token prefill,
for each weights choice, through the engine's own ModelRunner (no server, no sampling).

    python -m benchmarks.step_time [--weights none int8 int4] [--deterministic] [--transformers-forward]
                                   [--torch-int8] [--torch-norm] [--compile] [--threads 1]

Each figure is the fastest of --repeats steps after warm-up (on a shared machine the least disturbed
one), then the median; run it twice and compare. Decode rows attend to --context cached tokens each.
With several variants, a second table gives each one's step time over the first's, round by round:
the median ratio and its quartiles. On a busy machine, `--threads 1 --clock cpu` times the step's own
work (CPU time) rather than the spells other processes took the core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch

from engine_service.core.scheduler import ScheduledBatch
from engine_service.model import llama
from engine_service.model.loader import load_model, pick_dtype
from engine_service.model.runner import ModelRunner
from engine_service.model.step import StepInput

BLOCK = 16


@dataclass
class FakeRequest:
    adapter_slot: int = 0  # the base model


@dataclass
class FakeSequence:
    """The fields of a Sequence that ScheduledBatch.step_input reads for the ModelRunner."""

    seq_id: int
    token_ids: list[int]
    num_cached: int
    block_table: list[int] = field(default_factory=list)
    request: FakeRequest = field(default_factory=lambda: FakeRequest())


def build_runner(weights: str, deterministic: bool, num_blocks: int, lean_forward: bool = True,
                 native_kernels: bool = True, dtype: str = "auto") -> ModelRunner:
    loaded = load_model(None, device="cpu", dtype=dtype)
    return ModelRunner(loaded.model, loaded.device, loaded.dtype, BLOCK, num_blocks,
                       loaded.max_context_length, quantization=weights, deterministic=deterministic,
                       lean_forward=lean_forward, native_kernels=native_kernels)


def compiled(runner: ModelRunner, max_rows: int) -> ModelRunner:
    """`runner` with the engine's compiled decode step (model/compiled_step.py), every bucket up to `max_rows`
    compiled now (the seconds printed)."""
    print(f"compiled step: {runner.compile_decode(max_rows)}", flush=True)
    return runner


def torch_norm(runner: ModelRunner) -> ModelRunner:
    """`runner` with its lean forward's norms on F.rms_norm (the other native kernels kept)."""
    if runner.lean is not None:
        runner.lean = llama.LeanLlama(runner.model, None)
    return runner


def decode_batch(batch: int, context: int) -> StepInput:
    width = -(-(context + 1) // BLOCK)
    seqs = [FakeSequence(i, [(7 * i + j) % 1000 + 100 for j in range(context + 1)], context,
                         list(range(i * width, (i + 1) * width))) for i in range(batch)]
    return ScheduledBatch(decode=seqs).step_input()


def prefill_batch(length: int) -> StepInput:
    seq = FakeSequence(0, [(j * 13) % 1000 + 100 for j in range(length)], 0, list(range(-(-length // BLOCK))))
    return ScheduledBatch(prefill=[(seq, length)]).step_input()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_interleaved(runners: dict[str, ModelRunner], step: StepInput, rounds: int,
                     clock: str = "wall") -> dict[str, list[float]]:
    """Step times in ms per runner, one per round. Rounds alternate between the runners, every other
    one in reverse order, so a busy spell on the shared machine slows them all alike rather than one
    of them, and none always runs right after another."""
    now = CLOCKS[clock]
    times: dict[str, list[float]] = {name: [] for name in runners}
    for name, runner in runners.items():  # warm-up
        runner.run(step)
    names = list(runners)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            start = now()
            runners[name].run(step)
            times[name].append((now() - start) * 1000)
    return times


def paired(times: list[float], baseline: list[float]) -> str:
    """The median of the round-by-round ratios times / baseline, with their quartiles."""
    q1, median, q3 = statistics.quantiles([t / b for t, b in zip(times, baseline)], n=4)
    return f"{median:.3f} ({q1:.3f}-{q3:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", nargs="+", default=["none", "int8", "int4"], choices=["none", "int8", "int4"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=128, help="cached tokens per decode row")
    parser.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill step; 0: none")
    parser.add_argument("--repeats", type=int, default=20, help="rounds per case (a fifth of it for prefill)")
    parser.add_argument("--deterministic", action="store_true", help="also time int4 with --deterministic")
    parser.add_argument("--transformers-forward", action="store_true",
                        help="also time each weights choice through transformers' forward instead of the lean one")
    parser.add_argument("--torch-int8", action="store_true",
                        help="also time int8 on torch's kernel instead of the native one")
    parser.add_argument("--torch-norm", action="store_true",
                        help="also time each weights choice with the lean forward's add + RMSNorm as torch ops "
                             "(F.rms_norm) instead of the native rms_norm.c")
    parser.add_argument("--compile", action="store_true",
                        help="also time each weights choice with the engine's compiled decode step (--compiled-step "
                             "on: torch.compile per batch-size bucket, compiled before timing; prefill stays eager)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; default: all cores")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: elapsed time; cpu: this process's CPU time (with --threads 1, a step's own work "
                             "without the time other processes held the core)")
    parser.add_argument("--dtypes", nargs="+", default=["auto"], choices=["auto", "bfloat16", "float32"],
                        help="the model's dtype (auto: the engine's choice, bf16 where the CPU has native bf16 or AVX2)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    num_blocks = max(args.batches) * (-(-(args.context + 1) // BLOCK)) + args.prefill // BLOCK + 2
    runners: dict[str, ModelRunner] = {}
    for dtype in args.dtypes:
        label = f"{dtype} " if len(args.dtypes) > 1 else ""
        runners |= {f"{label}{weights}": build_runner(weights, False, num_blocks, dtype=dtype) for weights in args.weights}
        if args.deterministic:
            runners[f"{label}int4 det."] = build_runner("int4", True, num_blocks, dtype=dtype)
        if args.torch_int8:
            runners[f"{label}int8 (torch's kernel)"] = build_runner("int8", False, num_blocks, native_kernels=False,
                                                                  dtype=dtype)
        if args.torch_norm:
            runners |= {f"{label}{weights} (torch's norm)": torch_norm(build_runner(weights, False, num_blocks,
                                                                                   dtype=dtype))
                        for weights in args.weights}
        if args.compile:
            runners |= {f"{label}{weights} (compiled)": compiled(
                build_runner(weights, False, num_blocks, dtype=dtype), max(args.batches))
                for weights in args.weights}
        if args.transformers_forward:
            runners |= {f"{label}{weights} (transformers)": build_runner(weights, False, num_blocks,
                                                                          lean_forward=False, dtype=dtype)
                        for weights in args.weights}
    cases = [(f"decode b={batch}", decode_batch(batch, args.context), args.repeats) for batch in args.batches]
    if args.prefill:
        cases.append((f"prefill {args.prefill}", prefill_batch(args.prefill), max(3, args.repeats // 5)))
    print(f"dtype {', '.join(args.dtypes)} (auto: {pick_dtype('auto', torch.device('cpu'))}); "
          f"threads={torch.get_num_threads()} context={args.context} repeats={args.repeats} clock={args.clock}; "
          f"ms per step, fastest (median)")
    header = " | ".join(name for name, _, _ in cases)
    print(f"| weights | {header} |\n" + "| --- " * (len(cases) + 1) + "|")
    cells: dict[str, list[str]] = {name: [] for name in runners}
    ratios: dict[str, list[str]] = {name: [] for name in list(runners)[1:]}
    first = next(iter(runners))
    with torch.inference_mode():
        for _, step, rounds in cases:
            times = time_interleaved(runners, step, rounds, args.clock)
            for name, t in times.items():
                cells[name].append(f"{min(t):.1f} ({statistics.median(t):.1f})")
            for name in ratios:
                ratios[name].append(paired(times[name], times[first]))
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")
    if ratios:
        print(f"\nstep time / {first}'s, round by round: median (quartiles)\n| variant | {header} |\n"
              + "| --- " * (len(cases) + 1) + "|")
        for name, row in ratios.items():
            print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
