"""LoRA adapters under load (issue 54): the same closed-loop chat load on the base model alone, then spread
over 4 adapters, on one stack in one run; and one stream on the base model against one on an adapter (what a
resident adapter costs a batch-1 step).

    python -m benchmarks.lora                                  # 8 and 32 streams, 20 s a phase, rank 8
    python -m benchmarks.lora --concurrency 8 --seconds 10 --rounds 1
    python -m benchmarks.lora --step --threads 1               # in process: the decode step alone

`--step` times the engine's ModelRunner alone (benchmarks/step_time.py's harness, int8 weights): a decode step at
batch 1 and 8 on the base model, then with its rows on one adapter, then spread over all of them.

The adapters are written here (seeded, rank `--rank` on every attention and MLP projection, small weights as
a trained adapter's are) for the default model; the stack is the default one (int8 weights on the CPU) with
`--enable-lora`. Phases alternate base / adapters for `--rounds` rounds, so drift in the machine's load falls
on both alike; every request streams `--max-tokens` tokens (`ignore_eos`), so each phase does the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.prompts import PROMPTS
from benchmarks.stats import RequestResult, percentile
from benchmarks.targets import OpenAITarget
from launcher.stack import Stack

OUT = Path(__file__).parent / "out"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapters(folder: Path, count: int, rank: int) -> list[str]:
    """`count` PEFT adapters for the default model (its shapes from its config, no weights loaded)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine_service.model.loader import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(None)[1])
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = []
    for index in range(count):
        generator = torch.Generator().manual_seed(index)
        tensors = {}
        for name, module in skeleton.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in PROJECTIONS:
                tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(
                    rank, module.in_features, generator=generator) * 0.01
                tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(
                    module.out_features, rank, generator=generator) * 0.01
        adapter = folder / f"adapter-{index}"
        adapter.mkdir(parents=True)
        save_file(tensors, str(adapter / "adapter_model.safetensors"))
        (adapter / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(PROJECTIONS),
            "bias": "none"}))
        names.append(adapter.name)
    return names


async def closed_loop(targets: list[OpenAITarget], streams: int, seconds: float) -> tuple[list[RequestResult], float]:
    """`streams` clients, client i on targets[i % len(targets)], each sending one request after another."""
    results: list[RequestResult] = []
    stop = time.monotonic() + seconds

    async def client(worker: int) -> None:
        target, turn = targets[worker % len(targets)], worker
        while time.monotonic() < stop:
            results.append(await target.send(PROMPTS[turn % len(PROMPTS)]))
            turn += streams

    started = time.monotonic()
    await asyncio.gather(*(client(w) for w in range(streams)))
    return results, time.monotonic() - started


def figures(results: list[RequestResult], wall_s: float) -> dict:
    good = [r for r in results if r.ok]
    gaps = [(b - a) * 1000 for r in good for a, b in zip(r.text_times, r.text_times[1:])]
    return {"requests": len(results), "failed": len(results) - len(good),
            "tokens_per_s": sum(r.completion_tokens for r in good) / wall_s,
            "itl_p50_ms": percentile(gaps, 50), "ttft_p50_ms": percentile([r.text_times[0] * 1000 for r in good
                                                                             if r.text_times], 50)}


async def run(stack: Stack, adapters: list[str], args: argparse.Namespace) -> dict:
    async def opened(model: str) -> OpenAITarget:
        target = OpenAITarget(model, stack.base_url, args.max_tokens)
        await target.open()
        target.model = model or target.model
        target.extra_body = {"ignore_eos": True}
        return target

    base = await opened("")
    on_adapters = [await opened(name) for name in adapters]
    out: dict = {"levels": {}}
    try:
        await closed_loop([base, *on_adapters], 4, 5.0)  # warm up every adapter's path
        for streams in args.concurrency:
            rows: dict[str, list[dict]] = {"base": [], "adapters": []}
            for _ in range(args.rounds):
                for phase, targets in (("base", [base]), ("adapters", on_adapters)):
                    row = figures(*await closed_loop(targets, streams, args.seconds))
                    rows[phase].append(row)
                    print(f"{streams:>3} streams, {phase:>8}: {row['tokens_per_s']:6.1f} tok/s, ITL p50 "
                          f"{row['itl_p50_ms']:5.1f} ms ({row['failed']} failed)", flush=True)
            base_rate = statistics.median(r["tokens_per_s"] for r in rows["base"])
            lora_rate = statistics.median(r["tokens_per_s"] for r in rows["adapters"])
            out["levels"][streams] = {**rows, "adapters_over_base": lora_rate / base_rate}
            print(f"{streams:>3} streams: adapters / base = {lora_rate / base_rate:.2f}x", flush=True)
        gaps = {}
        for phase, target in (("base", base), ("one adapter", on_adapters[0])):
            gaps[phase] = figures(*await closed_loop([target], 1, args.seconds))["itl_p50_ms"]
        out["one_stream_itl_p50_ms"] = gaps
        print(f"one stream, ITL p50: base {gaps['base']:.2f} ms, one adapter {gaps['one adapter']:.2f} ms "
              f"(+{gaps['one adapter'] - gaps['base']:.2f} ms a step)", flush=True)
    finally:
        for target in (base, *on_adapters):
            await target.close()
    return out


def step_cost(folder: Path, adapters: list[str], args: argparse.Namespace) -> dict:
    """Decode step times (ms, median of interleaved rounds) with rows on the base model, on one adapter, and
    spread over every adapter."""
    from benchmarks import step_time
    from engine_service.model.lora import read_adapter

    torch.set_num_threads(args.threads)
    runner = step_time.build_runner("int8", deterministic=False, num_blocks=1024)
    for slot, name in enumerate(adapters, 1):
        runner.load_adapter(slot, read_adapter(folder / name, runner.linear_shapes, 64))
    out = {}
    for batch in (1, 8):
        steps = {}
        for label, slots in (("base", [0]), ("one adapter", [1]),
                             (f"{len(adapters)} adapters", list(range(1, len(adapters) + 1)))):
            step = step_time.decode_batch(batch, 128)
            for k, row in enumerate(step.decode):
                row.adapter = slots[k % len(slots)]
            steps[label] = step
        times: dict[str, list[float]] = {label: [] for label in steps}
        for label, step in steps.items():
            runner.run(step)  # warm-up
        for round_ in range(args.repeats):
            for label, step in steps.items() if round_ % 2 == 0 else reversed(steps.items()):
                started = time.perf_counter()
                runner.run(step)
                times[label].append((time.perf_counter() - started) * 1000)
        out[batch] = {label: statistics.median(t) for label, t in times.items()}
        print(f"batch {batch}: " + ", ".join(f"{label} {ms:.2f} ms" for label, ms in out[batch].items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2, help="base / adapters alternations per level")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--step", action="store_true", help="time the decode step in process instead")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for --step")
    parser.add_argument("--repeats", type=int, default=40, help="rounds for --step")
    parser.add_argument("--json", type=Path, default=OUT / "lora.json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    adapters = write_adapters(folder, args.adapters, args.rank)
    if args.step:
        step_cost(folder, adapters, args)
        return
    engine_args = ["--enable-lora", "--max-loras", str(args.adapters), "--lora-modules",
                   *(f"{name}={folder / name}" for name in adapters)]
    with Stack(engine_args=engine_args, log_dir=OUT / "lora-stack") as stack:
        result = asyncio.run(run(stack, adapters, args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
