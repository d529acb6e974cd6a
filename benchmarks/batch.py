"""`make bench-batch`: the Batch API against live traffic on one stack (the default model, as `make run-stack`
starts it without the embedding engine).

1. The engine's best throughput: live streamed chat requests (the batch's prompts and max_tokens) at each of
   `--concurrency` clients, output tokens/s; the best level is the reference.
2. A `--lines`-request chat batch alone: output tokens/s from its creation to its completion, against (1).
3. Interactive time to first token, p50, at 1 and 8 streams (`--ttft-requests` each stream, back to back): with
   the stack idle, then with a batch running (a fresh one, cancelled after), in alternating rounds.

Figures go to stdout and, with --json, a file; RESULTS.md's "Batch API" section quotes them with the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import openai

from benchmarks.bench import machine
from benchmarks.prompts import PROMPTS
from benchmarks.stats import RequestResult, percentile
from benchmarks.targets import SYSTEM_PROMPT, OpenAITarget, chat_messages
from launcher.stack import Stack


def log(message: str) -> None:
    print(f"[bench-batch {time.strftime('%H:%M:%S')}] {message}", flush=True)


def batch_lines(model: str, count: int, max_tokens: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"b{k}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": model, "messages": chat_messages(SYSTEM_PROMPT, PROMPTS[k % len(PROMPTS)]), "temperature": 0,
        "max_tokens": max_tokens}}).encode() + b"\n" for k in range(count))


def start_batch(client: openai.OpenAI, model: str, count: int, max_tokens: int) -> str:
    upload = client.files.create(file=("bench.jsonl", io.BytesIO(batch_lines(model, count, max_tokens))),
                                 purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                 completion_window="24h").id


def wait_batch(client: openai.OpenAI, batch_id: str):
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.5)
    return batch


async def live_level(target: OpenAITarget, concurrency: int, requests: int, max_tokens: int) -> dict:
    """`requests` live streamed requests, `concurrency` at a time: output tokens/s."""
    queue = list(range(requests))
    results: list[RequestResult] = []

    async def client() -> None:
        while queue:
            k = queue.pop()
            results.append(await target.send(PROMPTS[k % len(PROMPTS)], max_tokens=max_tokens))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    tokens = sum(r.completion_tokens for r in results if r.ok)
    return {"concurrency": concurrency, "requests": requests, "failed": sum(not r.ok for r in results),
            "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}


async def ttft(target: OpenAITarget, streams: int, per_stream: int, max_tokens: int) -> dict:
    results: list[RequestResult] = []

    async def stream(worker: int) -> None:
        for k in range(per_stream):
            results.append(await target.send(PROMPTS[(worker * per_stream + k) % len(PROMPTS)], max_tokens=max_tokens))

    await asyncio.gather(*(stream(w) for w in range(streams)))
    firsts = [r.text_times[0] * 1000 for r in results if r.ok and r.text_times]
    return {"streams": streams, "requests": len(results), "failed": sum(not r.ok for r in results),
            "ttft_p50_ms": round(percentile(firsts, 50), 1), "ttft_p95_ms": round(percentile(firsts, 95), 1)}


async def run(args: argparse.Namespace, stack: Stack) -> dict:
    sdk = openai.OpenAI(base_url=stack.base_url, api_key="bench", max_retries=0, timeout=600)
    target = OpenAITarget("conduit", stack.base_url, args.max_tokens)
    await target.open()
    model = target.model
    report: dict = {"machine": machine(), "lines": args.lines, "max_tokens": args.max_tokens,
                    "batch_max_in_flight": args.batch_max_in_flight, "engine_args": args.engine_args}
    await live_level(target, 4, 8, args.max_tokens)  # warm-up (first steps, allocator)
    levels = []
    for concurrency in args.concurrency:
        level = await live_level(target, concurrency, max(args.live_requests, 2 * concurrency), args.max_tokens)
        log(f"live at concurrency {concurrency}: {level}")
        levels.append(level)
    best = max(levels, key=lambda level: level["tokens_per_s"])
    report["live"], report["best"] = levels, best

    started = time.perf_counter()
    batch = await asyncio.to_thread(lambda: wait_batch(sdk, start_batch(sdk, model, args.lines, args.max_tokens)))
    wall = time.perf_counter() - started
    batch_tps = batch.usage.output_tokens / wall
    report["batch"] = {"status": batch.status, "requests": batch.request_counts.model_dump(), "wall_s": round(wall, 2),
                       "output_tokens": batch.usage.output_tokens, "tokens_per_s": round(batch_tps, 1),
                       "of_best": round(batch_tps / best["tokens_per_s"], 3)}
    log(f"batch alone: {report['batch']}")

    rounds: dict[str, list[dict]] = {"idle": [], "beside a batch": []}
    for round_ in range(args.rounds):
        order = ("idle", "beside a batch") if round_ % 2 == 0 else ("beside a batch", "idle")
        for case in order:
            batch_id = None
            if case == "beside a batch":
                batch_id = start_batch(sdk, model, args.lines, args.max_tokens)
                while sdk.batches.retrieve(batch_id).request_counts.completed < args.batch_max_in_flight:
                    await asyncio.sleep(0.2)  # running, its requests in the engine
            for streams in (1, 8):
                figures = await ttft(target, streams, args.ttft_requests, args.ttft_max_tokens)
                figures.update(case=case, round=round_)
                log(f"{case}: {figures}")
                rounds[case].append(figures)
            if batch_id is not None:
                sdk.batches.cancel(batch_id)
                await asyncio.to_thread(wait_batch, sdk, batch_id)
    report["ttft"] = rounds
    summary = {}
    for streams in (1, 8):
        idle = statistics.median(r["ttft_p50_ms"] for r in rounds["idle"] if r["streams"] == streams)
        busy = statistics.median(r["ttft_p50_ms"] for r in rounds["beside a batch"] if r["streams"] == streams)
        summary[f"{streams} streams"] = {"idle_ttft_p50_ms": idle, "beside_batch_ttft_p50_ms": busy,
                                         "ratio": round(busy / idle, 2)}
    report["ttft_summary"] = summary
    log(f"TTFT p50 (median of rounds): {summary}")
    await target.close()
    sdk.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[8, 16, 32])
    parser.add_argument("--live-requests", type=int, default=128, help="live requests at each concurrency")
    parser.add_argument("--batch-max-in-flight", type=int, default=32, help="the shim's default")
    parser.add_argument("--ttft-requests", type=int, default=6, help="requests per stream for TTFT")
    parser.add_argument("--ttft-max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine-args", default="")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/out/batch.json"))
    args = parser.parse_args()
    store = tempfile.mkdtemp(prefix="conduit-bench-batch-")
    with Stack(engine_args=args.engine_args.split(),
               shim_args=["--responses-store-dir", store, "--batch-max-in-flight", str(args.batch_max_in_flight)]
               ) as stack:
        report = asyncio.run(run(args, stack))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    log(f"written {args.json}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
