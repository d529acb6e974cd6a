"""`make bench-embed-mix`: do embeddings slow the chat streams beside them? One stack as `make run-stack`
starts it (the chat engine, the embedding engine, one shim); N chat streams (64 tokens each, back to
back) run alone and with M embedding clients (~200-token passages, one per request, back to back)
against the same shim, in alternating phases so the machine's load drifts over both alike.

Figures per phase: the chat streams' inter-token latency (p50, p99: gaps between text chunks, as
make bench counts them), their output tokens/s, and the embeddings per second beside them. Two
phases of each kind: the spread between phases of one kind is the noise a difference must beat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from benchmarks.embed import MODEL as EMBEDDING_MODEL
from benchmarks.embed import OUT, load, workloads
from benchmarks.stats import RequestResult, percentile
from benchmarks.targets import OpenAITarget
from launcher.stack import Stack

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle gear works.",
           "List ten facts about the Moon.", "Describe a walk through a forest in autumn."]


async def chat_streams(target: OpenAITarget, streams: int, seconds: float, max_tokens: int) -> list[RequestResult]:
    """`streams` clients, each streaming one chat completion after another, for `seconds`."""
    results: list[RequestResult] = []
    stop = time.monotonic() + seconds

    async def one(worker: int) -> None:
        i = worker
        while time.monotonic() < stop:
            results.append(await target.send(PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens))
            i += streams

    await asyncio.gather(*(one(w) for w in range(streams)))
    return results


async def phase(target: OpenAITarget, url: str, passages: list[str], args: argparse.Namespace,
                with_embeddings: bool) -> dict:
    started = time.monotonic()
    chat = chat_streams(target, args.streams, args.seconds, args.max_tokens)
    if with_embeddings:
        results, (embedded, _) = await asyncio.gather(chat, load(url, passages, args.embed_clients, args.seconds))
    else:
        results, embedded = await chat, 0
    elapsed = time.monotonic() - started
    good = [r for r in results if r.ok]
    gaps = [(b - a) * 1000 for r in good for a, b in zip(r.text_times, r.text_times[1:])]
    return {"phase": f"chat + {args.embed_clients} embedding clients" if with_embeddings else "chat alone",
            "streams": args.streams, "requests": len(results), "failed": len(results) - len(good),
            "itl_p50_ms": percentile(gaps, 50), "itl_p99_ms": percentile(gaps, 99),
            "chat_tokens_per_s": sum(r.completion_tokens for r in good) / elapsed,
            "embeddings_per_s": embedded / elapsed, "load_avg": os.getloadavg()[0]}


async def run(stack: Stack, args: argparse.Namespace) -> list[dict]:
    target = OpenAITarget("Conduit", stack.base_url, args.max_tokens, system="")
    await target.open()
    deadline = time.monotonic() + 60  # on a loaded machine the shim may not have heard from both engines yet
    while True:
        ids = await target.model_ids()
        chat_models = [i for i in ids if i != EMBEDDING_MODEL]
        if chat_models and EMBEDDING_MODEL in ids:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shim lists {ids}, not a chat model and {EMBEDDING_MODEL}")
        await asyncio.sleep(1)
    target.model = chat_models[0]
    passages = workloads()["~200-token passages"]
    url = f"{stack.base_url}/embeddings"
    try:
        await chat_streams(target, args.streams, 3.0, args.max_tokens)  # warm up both engines
        await load(url, passages, 2, 2.0)
        rows = []
        for round_ in range(args.rounds):
            for with_embeddings in (False, True):
                row = await phase(target, url, passages, args, with_embeddings)
                rows.append(row)
                print(f"round {round_} | {row['phase']:>30} | ITL p50 {row['itl_p50_ms']:6.1f} ms p99 "
                      f"{row['itl_p99_ms']:6.1f} ms | chat {row['chat_tokens_per_s']:6.1f} tok/s | "
                      f"{row['embeddings_per_s']:5.1f} embeddings/s | {row['failed']} failed | "
                      f"load {row['load_avg']:.1f}", flush=True)
        return rows
    finally:
        await target.close()


def table(rows: list[dict]) -> str:
    lines = ["| phase | ITL p50 ms | ITL p99 ms | chat tokens/s | embeddings/s | failed | load |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} | {r['chat_tokens_per_s']:.1f} | "
                     f"{r['embeddings_per_s']:.1f} | {r['failed']} | {r['load_avg']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=4, help="chat streams")
    parser.add_argument("--embed-clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--embedding-engine-args", default="", help="extra flags for the embedding engine")
    parser.add_argument("--json", type=Path, default=OUT / "embed_mix.json")
    args = parser.parse_args()
    stack = Stack(embedding_model=EMBEDDING_MODEL, log_dir=OUT / "embed-mix-stack")
    if args.embedding_engine_args:
        base = stack.embedding_command
        stack.embedding_command = lambda: base() + args.embedding_engine_args.split()  # type: ignore[method-assign]
    with stack:
        rows = asyncio.run(run(stack, args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
