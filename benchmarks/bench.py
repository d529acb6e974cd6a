"""Load generator: Conduit through the shim, Conduit over gRPC, and llama-server, same workload.

    python -m benchmarks.bench                       # starts the Conduit stack, then the peer
    python -m benchmarks.bench --base-url http://127.0.0.1:8000/v1 --engine 127.0.0.1:50051
    python -m benchmarks.bench --markdown --json benchmarks/out/results.json

Each level keeps `concurrency` streams in flight (closed loop) until
`multiplier x concurrency` requests have finished; one request at a time would hide batching.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from benchmarks import peer, report
from benchmarks.prompts import PROMPTS
from benchmarks.stats import LevelStats, summarize
from benchmarks.targets import GrpcTarget, OpenAITarget

Target = OpenAITarget | GrpcTarget
ALL_TARGETS = ("shim", "grpc", "peer")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_level(target: Target, concurrency: int, total: int) -> LevelStats:
    """Keeps `concurrency` requests in flight until `total` have finished."""
    indices = iter(range(total))
    results = []

    async def worker() -> None:
        for i in indices:  # shared by all workers: each request is taken once
            results.append(await target.send(PROMPTS[i % len(PROMPTS)]))

    cpu_start, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return summarize(target.name, concurrency, results, wall, cpu)


async def bench_target(target: Target, levels: list[int], multiplier: int) -> list[LevelStats]:
    """Warms the server up with one short burst at the top concurrency, then measures each level."""
    await target.open()
    try:
        warm = await asyncio.gather(
            *(target.send(PROMPTS[i % len(PROMPTS)], max_tokens=8) for i in range(max(levels)))
        )
        if not any(r.ok for r in warm):
            raise RuntimeError(f"{target.name}: warm-up failed: {warm[0].error}")
        out = []
        for concurrency in levels:
            stats = await run_level(target, concurrency, multiplier * concurrency)
            log(f"{target.name:>5} conc {concurrency:>3}: {stats.tokens_per_s:7.1f} tok/s, "
                f"TTFT p50 {stats.ttft_p50_ms:6.0f} ms, failed {stats.failed}")
            out.append(stats)
        return out
    finally:
        await target.close()


@contextlib.contextmanager
def conduit_stack(args: argparse.Namespace) -> Iterator[tuple[str | None, str | None]]:
    """Yields (shim base URL, engine address): the ones given, or a stack started here."""
    if args.base_url or args.engine:
        yield args.base_url, args.engine
        return
    from clients.launch import Stack  # only needed when the bench starts the stack itself

    log("starting the Conduit stack (engine + shim)...")
    with Stack(model=args.model) as stack:
        yield stack.base_url, stack.engine_address


def run_conduit(args: argparse.Namespace, wanted: list[str]) -> list[LevelStats]:
    with conduit_stack(args) as (base_url, engine):
        stats: list[LevelStats] = []
        for name, address in (("shim", base_url), ("grpc", engine)):
            if name in wanted and not address:
                log(f"{name} skipped: give --{'base-url' if name == 'shim' else 'engine'} too")
        if "shim" in wanted and base_url:
            target = OpenAITarget("shim", base_url, args.max_tokens, args.api_key)
            stats += asyncio.run(bench_target(target, args.concurrency, args.multiplier))
        if "grpc" in wanted and engine:
            target = GrpcTarget("grpc", engine, args.max_tokens)
            stats += asyncio.run(bench_target(target, args.concurrency, args.multiplier))
        return stats


def run_peer(args: argparse.Namespace) -> list[LevelStats]:
    if not args.peer_binary.exists():
        log(f"peer skipped: {args.peer_binary} missing (run benchmarks/build_llama_server.sh)")
        return []
    log("starting llama-server...")
    with peer.llama_server(args.peer_binary, parallel=max(args.concurrency)) as base_url:
        target = OpenAITarget("peer", base_url, args.max_tokens)
        return asyncio.run(bench_target(target, args.concurrency, args.multiplier))


def machine() -> dict[str, object]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,8,32",
                   type=lambda s: [int(x) for x in s.split(",") if x],
                   help="comma-separated concurrency levels (default 1,8,32)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--requests-per-level-multiplier", dest="multiplier", type=int, default=2,
                   help="requests per level = this x concurrency (default 2)")
    p.add_argument("--only", default=",".join(ALL_TARGETS),
                   type=lambda s: [x for x in s.split(",") if x],
                   help="comma-separated subset of shim,grpc,peer")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--base-url", help="use this running shim (http://HOST:PORT/v1)")
    p.add_argument("--engine", help="use this running engine (HOST:PORT)")
    p.add_argument("--api-key", default=os.environ.get("CONDUIT_API_KEY", "bench"))
    p.add_argument("--model", help="model for the stack the bench starts (default: the default)")
    p.add_argument("--peer-binary", type=Path, default=peer.DEFAULT_BINARY)
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--markdown", action="store_true", help="also print RESULTS.md-ready tables")
    args = p.parse_args(argv)
    unknown = set(args.only) - set(ALL_TARGETS)
    if unknown:
        p.error(f"--only: unknown target(s) {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [t for t in ALL_TARGETS if t in args.only and not (t == "peer" and args.skip_peer)]
    stats: list[LevelStats] = []
    if "shim" in wanted or "grpc" in wanted:
        stats += run_conduit(args, wanted)
    # The peer runs after the stack is stopped, so the two never share the CPU.
    if "peer" in wanted:
        stats += run_peer(args)
    stats.sort(key=lambda s: (s.concurrency, ALL_TARGETS.index(s.target)))

    print(report.text_table(stats))
    if args.markdown:
        print()
        print(report.markdown(stats))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(),
            "command": " ".join(["python -m benchmarks.bench", *(argv or sys.argv[1:])]),
            "max_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "requests_per_level_multiplier": args.multiplier,
            "results": [asdict(s) for s in stats],
            "ratios": [asdict(r) for r in report.ratios(stats)],
        }, indent=2))
    return 1 if any(s.failed for s in stats) else 0


if __name__ == "__main__":
    sys.exit(main())
