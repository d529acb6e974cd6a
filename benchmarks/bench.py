"""Load generator: Conduit through the shim, Conduit over gRPC, and llama-server, same workload.

    python -m benchmarks.bench                       # starts the Conduit stack and llama-server
    python -m benchmarks.bench --base-url http://127.0.0.1:8000/v1 --engine 127.0.0.1:50051
    python -m benchmarks.bench --json benchmarks/out/results.json --write-results benchmarks/RESULTS.md
    python -m benchmarks.bench --skip-peer --concurrency 32 --repeats 1 --min-seconds 10   # a quick look

Each level keeps `concurrency` streams in flight (closed loop) for at least `--min-seconds` and
`multiplier x concurrency` requests, whichever takes longer; one request at a time would hide
batching. The whole comparison runs `--repeats` times and the report gives medians and ranges;
then the prefix-cache scenario (prefix_cache.py) runs against the shim and the peer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from benchmarks import peer, prefix_cache, report
from benchmarks.cpu import CpuMeter
from benchmarks.prefix_cache import PrefixStats
from benchmarks.stats import LevelStats, summarize
from benchmarks.targets import WORKLOADS, GrpcTarget, OpenAITarget
from launcher.stack import DEFAULT_EMBEDDING_MODEL, Stack, embedding_model_or_none, free_port

Target = OpenAITarget | GrpcTarget
ALL_TARGETS = ("shim", "grpc", "peer")
# Above this share of one core used by other processes, a level's figures are not trustworthy.
BUSY_OTHER_CPU_PCT = 20


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Server:
    """A target and the processes that serve it (empty when they were started elsewhere)."""

    target: Target
    pids: list[int]
    relay_pids: list[int] = field(default_factory=list)  # of `pids`, the shim's


@contextlib.asynccontextmanager
async def connected(target: Target) -> AsyncIterator[Target]:
    """A fresh client (and gRPC channel) for each level, so no level inherits another's state."""
    await target.open()
    try:
        yield target
    finally:
        await target.close()


@dataclass
class Level:
    """How long each level runs: until both hold, then the requests in flight finish."""

    min_requests_per_stream: int  # requests = this x concurrency, at least
    min_seconds: float


async def run_level(server: Server, concurrency: int, level: Level, repeat: int,
                    prompts: tuple[str, ...]) -> LevelStats:
    """Keeps `concurrency` requests in flight, `prompts` in turn, until `level` says enough have been sent."""
    results = []
    sent = 0
    async with connected(server.target) as target:
        meter, start = CpuMeter(server.pids, server.relay_pids), time.perf_counter()

        def take() -> int | None:
            """The next request's index, or None once the level has run long enough."""
            nonlocal sent
            if (sent >= level.min_requests_per_stream * concurrency
                    and time.perf_counter() - start >= level.min_seconds):
                return None
            sent += 1
            return sent - 1

        async def worker() -> None:
            while (i := take()) is not None:
                results.append(await target.send(prompts[i % len(prompts)]))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return summarize(target.name, concurrency, repeat, results, wall, meter.stop())


async def warm_up(target: Target, burst: int, prompts: tuple[str, ...]) -> None:
    """One short burst at the top concurrency, so no level pays for first-call costs."""
    async with connected(target):
        warm = await asyncio.gather(
            *(target.send(prompts[i % len(prompts)], max_tokens=8) for i in range(burst))
        )
    if not any(r.ok for r in warm):
        raise RuntimeError(f"{target.name}: warm-up failed: {warm[0].error}")


async def run_all(servers: list[Server], levels: list[int], level: Level, repeats: int,
                  prompts: tuple[str, ...]) -> list[LevelStats]:
    """Targets take turns within each level, so a busy spell on a shared machine hits them alike;
    the whole comparison repeats, so one spell cannot decide a ratio. Every other repeat reverses
    the turns, so a machine that drifts over a level favours neither the first target nor the last."""
    for server in servers:
        await warm_up(server.target, max(levels), prompts)
    out = []
    for repeat in range(repeats):
        for concurrency in levels:
            for server in (servers if repeat % 2 == 0 else servers[::-1]):
                stats = await run_level(server, concurrency, level, repeat, prompts)
                log(f"run {repeat + 1}/{repeats} {stats.target:>5} conc {concurrency:>3}: "
                    f"{stats.tokens_per_s:7.1f} tok/s, TTFT p50 {stats.ttft_p50_ms:6.0f} ms, "
                    f"{stats.requests} reqs in {stats.wall_s:.0f} s, failed {stats.failed}, "
                    f"other CPU {stats.other_cpu_pct:.0f}%")
                out.append(stats)
    return out


async def run_prefix(servers: list[Server], samples: int) -> list[PrefixStats]:
    """The prefix-cache scenario against every OpenAI target (the shim and the peer)."""
    out = []
    run_seed = int(time.time())  # servers started elsewhere may have cached earlier runs' prompts
    for server in servers:
        if not isinstance(server.target, OpenAITarget) or samples <= 0:
            continue
        async with connected(server.target) as target:
            stats = await prefix_cache.measure(target, samples, run_seed)
        log(f"prefix cache {stats.target:>5}: cold TTFT {stats.cold_ttft_ms} ms, warm {stats.warm_ttft_ms} ms, "
            f"cached {stats.warm_cached_tokens}, errors {stats.errors}")
        out.append(stats)
    return out


@contextlib.contextmanager
def conduit_stack(
    args: argparse.Namespace,
) -> Iterator[tuple[str | None, str | None, list[int], list[int], str | None]]:
    """Yields the shim's base URL, the engine's address, the engine's pids and the shim's, and the engine's
    metrics URL: the ones given (no pids, no metrics), or a stack started here."""
    if args.base_url or args.engine:
        yield args.base_url, args.engine, [], [], None
        return
    embedding_model = embedding_model_or_none(args.embedding_model)
    log(f"starting the Conduit stack (engine + shim{' + embedding engine' if embedding_model else ''})...")
    with Stack(model=args.model, engine_args=shlex.split(args.engine_args), embedding_model=embedding_model,
               log_dir=peer.LOG_DIR / "stack", metrics_port=free_port()) as stack:
        assert stack.engine is not None and stack.shim is not None
        engine_pid, shim_pid = stack.engine.pid, stack.shim.pid
        yield stack.base_url, stack.engine_address, [engine_pid], [shim_pid], stack.metrics_url


def speculation(metrics_url: str | None) -> dict[str, float] | None:
    """The engine's n-gram drafting over the whole run (its counters, named as vLLM's): drafts, draft tokens,
    accepted tokens and their share; None when it drafted nothing (or runs without metrics)."""
    if metrics_url is None:
        return None
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    counters = {name: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith(f"conduit:spec_decode_{name}_total"))
                for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    if not counters["num_draft_tokens"]:
        return None
    return {**counters, "acceptance_rate": counters["num_accepted_tokens"] / counters["num_draft_tokens"]}


def start_servers(args: argparse.Namespace, wanted: list[str], stack: contextlib.ExitStack
                  ) -> tuple[list[Server], str | None]:
    """Starts (or finds) every wanted server; all stay up, idle but for the one being measured. Also the
    Conduit engine's metrics URL where this run started it."""
    servers: list[Server] = []
    metrics_url = None
    system = WORKLOADS[args.workload].system
    if "shim" in wanted or "grpc" in wanted:
        base_url, engine, engine_pids, shim_pids, metrics_url = stack.enter_context(conduit_stack(args))
        for name, address in (("shim", base_url), ("grpc", engine)):
            if name in wanted and not address:
                log(f"{name} skipped: give --{'base-url' if name == 'shim' else 'engine'} too")
        if "shim" in wanted and base_url:
            servers.append(Server(OpenAITarget("shim", base_url, args.max_tokens, args.api_key, system),
                                  engine_pids + shim_pids, relay_pids=shim_pids))
        if "grpc" in wanted and engine:
            servers.append(Server(GrpcTarget("grpc", engine, args.max_tokens, system), engine_pids))
    if "peer" in wanted:
        if not args.peer_binary.exists():
            log(f"peer skipped: {args.peer_binary} missing (run benchmarks/build_llama_server.sh)")
        else:
            log("starting llama-server...")
            url, pid = stack.enter_context(
                peer.llama_server(args.peer_binary, parallel=max(args.concurrency)))
            servers.append(Server(OpenAITarget("peer", url, args.max_tokens, system=system), [pid]))
    return servers, metrics_url


def conduit_model(servers: list[Server]) -> str:
    """How the engine serves the model (dtype, device), from GetModelInfo, for RESULTS.md."""
    grpc_target = next((s.target for s in servers if isinstance(s.target, GrpcTarget)), None)
    if grpc_target is None:
        return "not measured over gRPC"
    try:
        info = asyncio.run(grpc_target.model_info())
    except grpc.aio.AioRpcError as exc:  # the figures are still worth writing out
        return f"unknown model details ({exc.code().name})"
    return f"{info.id} from {info.source}, {info.dtype} on {info.device}"


def machine() -> dict[str, object]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1min_at_start": os.getloadavg()[0]}


def run_context(
    args: argparse.Namespace, host: dict[str, object], argv: list[str] | None, engine_info: str
) -> dict[str, object]:
    """What a reader needs to reproduce the figures."""
    packages = ("torch", "transformers", "grpcio", "aiohttp")
    versions = ", ".join(f"{name} {_version(name)}" for name in packages)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python -m benchmarks.bench", *(sys.argv[1:] if argv is None else argv)]),
        "machine": host,
        "software": versions,
        "conduit": f"{engine_info}; engine flags: {args.engine_args or 'defaults'}; beside it "
                   + (f"an idle embedding engine ({args.embedding_model})"
                      if embedding_model_or_none(args.embedding_model) else "no embedding engine"),
        "peer": peer.describe(args.peer_binary, max(args.concurrency)),
        "workload": args.workload,
        "prompts": len(WORKLOADS[args.workload].prompts),
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "multiplier": args.multiplier,
        "min_seconds": args.min_seconds,
        "repeats": args.repeats,
        "prefix_samples": args.prefix_samples,
        "prefix_max_tokens": prefix_cache.MAX_TOKENS,
    }


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,8,32",
                   type=lambda s: [int(x) for x in s.split(",") if x],
                   help="comma-separated concurrency levels (default 1,8,32)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="chat",
                   help="chat: each request has a short system message; short-chat: none (the user's turn alone); "
                        "quote: answers that repeat a passage or function of the prompt with one edit")
    p.add_argument("--requests-per-level-multiplier", dest="multiplier", type=int, default=4,
                   help="each level sends at least this x concurrency requests (default 4)")
    p.add_argument("--min-seconds", type=float, default=20.0,
                   help="each level runs at least this long (default 20)")
    p.add_argument("--repeats", type=int, default=3,
                   help="how many times the whole comparison runs (default 3); medians and ranges are reported")
    p.add_argument("--prefix-samples", type=int, default=5,
                   help="cold/warm pairs of the prefix-cache scenario per target (default 5; 0 skips it)")
    p.add_argument("--only", default=",".join(ALL_TARGETS),
                   type=lambda s: [x for x in s.split(",") if x],
                   help="comma-separated subset of shim,grpc,peer")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--base-url", help="use this running shim (http://HOST:PORT/v1)")
    p.add_argument("--engine", help="use this running engine (HOST:PORT)")
    p.add_argument("--api-key", default=os.environ.get("CONDUIT_API_KEY", "bench"))
    p.add_argument("--model", help="model for the stack the bench starts (default: the default)")
    p.add_argument("--engine-args", default="",
                   help='extra flags for the engine the bench starts, e.g. "--max-batch-size 32"')
    p.add_argument("--embedding-model", default=DEFAULT_EMBEDDING_MODEL, metavar="PATH_OR_ID",
                   help="the embedding engine the bench's stack starts beside the chat engine, idle, as `make "
                        "run-stack` does (the two share the cores by demand); none: chat alone")
    p.add_argument("--peer-binary", type=Path, default=peer.DEFAULT_BINARY)
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--markdown", action="store_true", help="also print RESULTS.md-ready tables")
    p.add_argument("--write-results", type=Path, metavar="PATH",
                   help="write a whole RESULTS.md here (its Notes section is kept)")
    args = p.parse_args(argv)
    unknown = set(args.only) - set(ALL_TARGETS)
    if unknown:
        p.error(f"--only: unknown target(s) {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `kill` unwinds like Ctrl-C, so the servers this run started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    host = machine()
    wanted = [t for t in ALL_TARGETS if t in args.only and not (t == "peer" and args.skip_peer)]
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        servers, metrics_url = start_servers(args, wanted, stack)
        level = Level(args.multiplier, args.min_seconds)
        prompts = WORKLOADS[args.workload].prompts
        stats = asyncio.run(run_all(servers, args.concurrency, level, args.repeats, prompts))
        prefix = asyncio.run(run_prefix(servers, args.prefix_samples))
        engine_info = conduit_model(servers)
        drafting = speculation(metrics_url)
    busy = [f"{s.target}@{s.concurrency}" for s in stats if s.other_cpu_pct > BUSY_OTHER_CPU_PCT]
    if busy:
        log(f"warning: other processes used over {BUSY_OTHER_CPU_PCT}% CPU during {', '.join(busy)}; "
            "those figures are skewed: rerun on a quiet machine")

    print(report.text_table(stats, prefix))
    if args.markdown:
        print()
        print(report.markdown(stats, prefix))
    context = {**run_context(args, host, argv, engine_info), "elapsed_min": (time.perf_counter() - began) / 60}
    if drafting is not None:
        context["speculation"] = drafting
        log(f"speculative decoding over the run: {drafting['num_drafts']:.0f} drafts, "
            f"{drafting['num_draft_tokens']:.0f} draft tokens, {drafting['num_accepted_tokens']:.0f} accepted "
            f"(acceptance rate {drafting['acceptance_rate']:.2f})")
    log(f"whole run: {context['elapsed_min']:.1f} minutes")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            **context,
            "results": [asdict(s) for s in stats],
            "ratios": [{**asdict(r), "met": r.met} for r in report.ratio_summaries(stats)],
            "prefix_cache": [asdict(p) for p in prefix],
        }, indent=2))
    if args.write_results:
        previous = args.write_results.read_text() if args.write_results.exists() else ""
        args.write_results.write_text(report.results_document(stats, prefix, context, previous))
    return 1 if any(s.failed for s in stats) or any(p.errors for p in prefix) else 0


if __name__ == "__main__":
    sys.exit(main())
