"""Routing policies side by side (issues 32, 42): cache_aware (by the engines' KV events, and by the shim's
text view), least_load and round_robin on the same replicas.

Two engine replicas (started here, or `--engines A,B` of a running `REPLICAS=2 make run-stack`),
each with a KV cache too small to hold every shared prefix (--kv-cache-tokens, default 10,000
tokens: about nine of the workload's sixteen ~1,020-token system prompts; half of them fit). The workload: PROMPTS_N distinct ~1,000-token system
prompts, USERS users each asking their own question under each, in rounds (every system prompt
once per round, each round in a new random order), CONCURRENCY requests in flight. Each arm gets
its own shim process (`--routing P`, and for cache_aware `--routing-prefix-view V`: kv_events, the
engines' own KV events with each prompt tokenized by an engine, or text, the shim's view of what it
sent) against the same engines and a fresh set of system prompts (so no arm finds another's prefixes
cached); the first round of every arm is all misses. `--shims N` puts N shims over the same engines,
taking the requests in turn (shims scaled out behind a load balancer): each text view then sees only
its own share, while the KV events show every shim what the engines hold.

Reported per policy: the prefix-cache hit rate (cached_tokens over prompt_tokens, the engines'
own counts in the usage chunk), TTFT p50/p99 and output tok/s over the policy's wall time.
The machine is shared: absolute figures are noisy; compare policies within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.prompts import PROMPTS, long_system_prompt
from benchmarks.stats import RequestResult, percentile
from benchmarks.targets import OpenAITarget
from launcher.stack import REPO_ROOT, Stack
from conduit_common.lifetime import child_env

# Arm -> the shim's routing flags.
ARMS = {
    "cache_aware:kv_events": ["--routing", "cache_aware", "--routing-prefix-view", "kv_events"],
    "cache_aware:text": ["--routing", "cache_aware", "--routing-prefix-view", "text"],
    "round_robin": ["--routing", "round_robin"],
    "least_load": ["--routing", "least_load"],
}
MAX_TOKENS = 16


@dataclass
class PolicyStats:
    policy: str
    requests: int
    errors: int
    hit_rate: float  # cached prompt tokens / prompt tokens
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_s: float
    wall_s: float


def start_shim(engines: str, policy: str) -> tuple[subprocess.Popen, str]:
    """A shim over `engines` routing as `policy` (an arm of ARMS, or a --routing policy)."""
    flags = ARMS.get(policy, ["--routing", policy])
    process = subprocess.Popen([sys.executable, "-m", "http_shim", "--engine", engines, "--port", "0",
                                *flags, "--log-level", "WARNING", "--responses-store-dir", ""],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=child_env())
    line = process.stdout.readline()
    match = re.search(r"http://[\d.]+:(\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"unexpected shim output: {line!r}")
    return process, f"http://127.0.0.1:{match.group(1)}/v1"


def workload(seed: int, prompts: int, users: int) -> list[tuple[str, str]]:
    """(system prompt, question) in send order: `users` rounds, each every system prompt once."""
    systems = [long_system_prompt(seed + k) for k in range(prompts)]
    rng = random.Random(seed)
    order = []
    for user in range(users):
        round_ = list(range(prompts))
        rng.shuffle(round_)
        order += [(systems[k], PROMPTS[(user * prompts + k) % len(PROMPTS)]) for k in round_]
    return order


async def run_policy(policy: str, base_url: str | list[str], requests: list[tuple[str, str]],
                     concurrency: int) -> PolicyStats:
    """`base_url`: one shim, or several (each request to the next in turn, as a load balancer would)."""
    targets = [OpenAITarget(policy, url, MAX_TOKENS) for url in ([base_url] if isinstance(base_url, str) else base_url)]
    for target in targets:
        await target.open()
    queue: asyncio.Queue[tuple[int, tuple[str, str]]] = asyncio.Queue()
    for item in enumerate(requests):
        queue.put_nowait(item)
    results: list[RequestResult] = []

    async def worker() -> None:
        while not queue.empty():
            k, (system, question) = queue.get_nowait()
            results.append(await targets[k % len(targets)].send(question, MAX_TOKENS, system=system))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    for target in targets:
        await target.close()
    ok = [r for r in results if r.ok]
    ttfts = [r.text_times[0] * 1000 for r in ok if r.text_times]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return PolicyStats(policy, len(results), len(results) - len(ok), cached / prompt if prompt else 0.0,
                       percentile(ttfts, 50), percentile(ttfts, 99),
                       sum(r.completion_tokens for r in ok) / wall, wall)


def markdown(stats: list[PolicyStats], context: dict[str, object]) -> str:
    rows = ["| policy | requests | errors | prefix-cache hit rate | TTFT p50 ms | TTFT p99 ms | tok/s | wall s |",
            "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {s.policy} | {s.requests} | {s.errors} | {s.hit_rate:.1%} | {s.ttft_p50_ms:.0f} | "
             f"{s.ttft_p99_ms:.0f} | {s.tokens_per_s:.1f} | {s.wall_s:.1f} |" for s in stats]
    return "\n".join([f"Workload: {json.dumps(context)}", "", *rows])


async def main_async(args: argparse.Namespace, engines: str) -> list[PolicyStats]:
    stats = []
    for index, policy in enumerate(args.policies):
        shims = [start_shim(engines, policy) for _ in range(args.shims)]
        base_urls = [url for _, url in shims]
        try:
            warm = workload(10_000_000 + index, 2, 1)  # a first request per replica: nothing is cold but the cache
            await run_policy(policy, base_urls, warm, 2)
            requests = workload(args.seed + 1000 * (index + 1), args.prompts, args.users)
            stats.append(await run_policy(policy, base_urls, requests, args.concurrency))
            print(markdown(stats[-1:], {"policy": policy}).splitlines()[-1], flush=True)
        finally:
            for shim, _ in shims:
                shim.terminate()
                shim.wait(10)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", help="A,B: running replicas (default: start two here)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kv-cache-tokens", type=int, default=10_000)
    parser.add_argument("--prompts", type=int, default=16, help="distinct ~1,000-token system prompts")
    parser.add_argument("--users", type=int, default=4, help="questions per system prompt (rounds)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--shims", type=int, default=1,
                        help="shims per arm, over the same engines, taking the requests in turn")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--policies", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    context = {"replicas": args.replicas, "kv_cache_tokens": args.kv_cache_tokens, "system_prompts": args.prompts,
               "users_per_prompt": args.users, "concurrency": args.concurrency, "max_tokens": MAX_TOKENS,
               "shims": args.shims}
    if args.engines:
        stats = asyncio.run(main_async(args, args.engines))
    else:
        with Stack(replicas=args.replicas, engine_args=["--kv-cache-tokens", str(args.kv_cache_tokens)],
                   startup_timeout=600) as stack:
            stats = asyncio.run(main_async(args, ",".join(stack.engine_addresses)))
    print(markdown(stats, context))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"context": context, "policies": [asdict(s) for s in stats]}, indent=2))


if __name__ == "__main__":
    main()
