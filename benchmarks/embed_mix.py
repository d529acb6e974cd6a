"""`make bench-embed-mix`: do embeddings slow the chat streams beside them, and does an idle embedding engine?
Stacks as `make run-stack` starts them (the chat engine, the embedding engine, one shim); N chat streams
(64 tokens each, back to back) run with no embedding traffic, with M embedding clients (~200-token
passages, one per request, back to back), or with one client of short queries (a trickle: the
embedding engine's work comes and goes between requests), against the same shim, in alternating
phases so the machine's load drifts over every case alike.

Arms (`--arms`), each a stack of its own, all up at once and measured in turn, in reverse order every
other round:
- `default`: the launcher's own choice (the chat engine on every core while the embedding engine is idle,
  on its share while it has work: launcher/stack.py's thread_shares, --core-share);
- `split`: the fixed split the launcher used before: the chat engine on its share whether the embedding
  engine works or not;
- `static`: the chat engine on every core whatever the embedding engine does (threads that outnumber the
  cores under embedding traffic);
- `alone`: no embedding engine (`EMBEDDING_MODEL=none`); phases without embedding traffic only.

Figures per phase: the chat streams' inter-token latency (p50, p99: gaps between text chunks, as
make bench counts them), their output tokens/s, the embeddings per second beside them, and the CPU the
rest of the machine took meanwhile (benchmarks/cpu.py: every process but the stacks' and this one's).
Then each case's median over its quiet rounds (--quiet), and its tokens/s in every round: on a shared
machine, an engine on every core collapses while other work takes a core (OpenMP's waits again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from benchmarks.cpu import CpuMeter
from benchmarks.embed import MODEL as EMBEDDING_MODEL
from benchmarks.embed import OUT, load, workloads
from benchmarks.stats import RequestResult, percentile
from benchmarks.targets import OpenAITarget
from launcher.stack import Stack, thread_shares

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle gear works.",
           "List ten facts about the Moon.", "Describe a walk through a forest in autumn."]
ARMS = ("default", "split", "static", "alone")
EMBED_LOADS = ("none", "passages", "queries")


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


def phase_name(embed_load: str, args: argparse.Namespace) -> str:
    return {"none": "chat alone", "passages": f"chat + {args.embed_clients} embedding clients",
            "queries": "chat + 1 client of short queries"}[embed_load]


async def phase(target: OpenAITarget, url: str, args: argparse.Namespace, streams: int, embed_load: str,
                pids: list[int]) -> dict:
    """One phase; `pids`: every stack's processes, so what the rest of the machine took is known."""
    meter = CpuMeter(pids)
    started = time.monotonic()
    chat = chat_streams(target, streams, args.seconds, args.max_tokens)
    pools = workloads()
    if embed_load == "none":
        results, embedded = await chat, 0
    else:
        texts, clients = ((pools["~200-token passages"], args.embed_clients) if embed_load == "passages"
                          else (pools["short queries"], 1))
        results, (embedded, _) = await asyncio.gather(chat, load(url, texts, clients, args.seconds))
    elapsed = time.monotonic() - started
    cpu = meter.stop()
    good = [r for r in results if r.ok]
    gaps = [(b - a) * 1000 for r in good for a, b in zip(r.text_times, r.text_times[1:])]
    return {"phase": phase_name(embed_load, args), "embed_load": embed_load, "streams": streams,
            "requests": len(results), "failed": len(results) - len(good),
            "itl_p50_ms": percentile(gaps, 50), "itl_p99_ms": percentile(gaps, 99),
            "chat_tokens_per_s": sum(r.completion_tokens for r in good) / elapsed,
            "embeddings_per_s": embedded / elapsed, "load_avg": os.getloadavg()[0], "other_cpu_pct": cpu.other}


async def open_target(stack: Stack, embedding: bool, max_tokens: int) -> OpenAITarget:
    target = OpenAITarget("Conduit", stack.base_url, max_tokens, system="")
    await target.open()
    deadline = time.monotonic() + 60  # on a loaded machine the shim may not have heard from both engines yet
    while True:
        ids = await target.model_ids()
        chat_models = [i for i in ids if i != EMBEDDING_MODEL]
        if chat_models and (EMBEDDING_MODEL in ids or not embedding):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shim lists {ids}, not a chat model and {EMBEDDING_MODEL}")
        await asyncio.sleep(1)
    target.model = chat_models[0]
    return target


async def run(stacks: dict[str, Stack], args: argparse.Namespace) -> list[dict]:
    targets = {arm: await open_target(stack, stack.embedding_model is not None, args.max_tokens)
               for arm, stack in stacks.items()}
    urls = {arm: f"{stack.base_url}/embeddings" for arm, stack in stacks.items()}
    pids = [proc.pid for stack in stacks.values() for proc in (*stack.engines, stack.embedder, stack.shim) if proc]
    try:
        for arm, target in targets.items():  # warm up every engine
            await chat_streams(target, max(args.streams), 3.0, args.max_tokens)
            if stacks[arm].embedding_model:
                await load(urls[arm], workloads()["~200-token passages"], 2, 2.0)
        rows = []
        for round_ in range(args.rounds):
            order = list(stacks) if round_ % 2 == 0 else list(reversed(stacks))
            for streams in args.streams:
                for embed_load in args.embed_loads:
                    for arm in order:
                        if embed_load != "none" and stacks[arm].embedding_model is None:
                            continue
                        row = {"arm": arm, "round": round_,
                               **await phase(targets[arm], urls[arm], args, streams, embed_load, pids)}
                        rows.append(row)
                        print(f"round {round_} | {arm:>7} | {streams} streams | {row['phase']:>32} | ITL p50 "
                              f"{row['itl_p50_ms']:6.1f} ms p99 {row['itl_p99_ms']:7.1f} ms | chat "
                              f"{row['chat_tokens_per_s']:6.1f} tok/s | {row['embeddings_per_s']:5.1f} embeddings/s | "
                              f"{row['failed']} failed | others {row['other_cpu_pct']:3.0f}% CPU", flush=True)
        return rows
    finally:
        for target in targets.values():
            await target.close()


def table(rows: list[dict], quiet: float) -> str:
    """Each case's median over its quiet rounds (the rest of the machine took under `quiet`% of a core
    meanwhile; all rounds where none was quiet), with chat tokens/s over every round beside it."""
    lines = ["| arm | streams | phase | quiet rounds | ITL p50 ms | ITL p99 ms | chat tokens/s | embeddings/s "
             "| chat tokens/s, every round | others' CPU % | failed |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        cases.setdefault((r["streams"], r["embed_load"], r["arm"]), []).append(r)
    for (streams, _, arm), group in sorted(cases.items(), key=lambda item: (
            item[0][0], EMBED_LOADS.index(item[0][1]), ARMS.index(item[0][2]))):
        calm = [r for r in group if r["other_cpu_pct"] < quiet] or group

        def med(key: str, of: list[dict] = calm) -> float:
            return statistics.median(r[key] for r in of)

        every = " / ".join(f"{r['chat_tokens_per_s']:.1f}" for r in group)
        others = " / ".join(f"{r['other_cpu_pct']:.0f}" for r in group)
        counted = f"0 of {len(group)} (all counted)" if calm is group else f"{len(calm)} of {len(group)}"
        lines.append(f"| {arm} | {streams} | {group[0]['phase']} | {counted} | {med('itl_p50_ms'):.1f} | "
                     f"{med('itl_p99_ms'):.1f} | {med('chat_tokens_per_s'):.1f} | {med('embeddings_per_s'):.1f} | "
                     f"{every} | {others} | {sum(r['failed'] for r in group)} |")
    return "\n".join(lines)


def make_stack(arm: str, args: argparse.Namespace) -> Stack:
    """The arm's stack: the launcher's default, or its threads set by hand (see the module's docstring)."""
    log_dir = OUT / f"embed-mix-{arm}"
    extra = args.embedding_engine_args.split()
    if arm == "default":
        return Stack(embedding_model=EMBEDDING_MODEL, log_dir=log_dir, embedding_args=extra)
    if arm == "alone":
        return Stack(log_dir=log_dir)
    shares = thread_shares(len(os.sched_getaffinity(0)), 1, True)
    assert shares is not None
    chat = shares.chat_beside_embedding if arm == "split" else shares.chat
    # A --threads of ours: the launcher then gives no shares (and no --core-share), so set both engines'.
    return Stack(embedding_model=EMBEDDING_MODEL, log_dir=log_dir, engine_args=["--threads", str(chat)],
                 embedding_args=["--threads", str(shares.embedding), *extra])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="default", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--streams", default="4", help="chat streams, comma-separated levels")
    parser.add_argument("--embed-loads", default="none,passages",
                        help=f"comma-separated, of {', '.join(EMBED_LOADS)}: no embedding traffic, "
                             "--embed-clients clients of passages, one client of short queries")
    parser.add_argument("--embed-clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--embedding-engine-args", default="", help="extra flags for the embedding engine")
    parser.add_argument("--quiet", type=float, default=25.0,
                        help="the table's medians count the rounds where the rest of the machine took under this "
                             "percent of a core (all rounds where none did)")
    parser.add_argument("--json", type=Path, default=OUT / "embed_mix.json")
    args = parser.parse_args()
    arms = args.arms.split(",")
    args.streams = [int(s) for s in args.streams.split(",")]
    args.embed_loads = args.embed_loads.split(",")
    for name, picked, allowed in (("--arms", arms, ARMS), ("--embed-loads", args.embed_loads, EMBED_LOADS)):
        if unknown := set(picked) - set(allowed):
            parser.error(f"{name}: unknown {', '.join(sorted(unknown))}")
    with ExitStack() as running:
        stacks = {arm: running.enter_context(make_stack(arm, args)) for arm in arms}
        rows = asyncio.run(run(stacks, args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(f"CPU: {cpu_name()}, {len(os.sched_getaffinity(0))} cores")
    print(table(rows, args.quiet))


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
