"""Conduit's shim routing against the Shepherd Model Gateway (smg) over the same two engines (issue 42).

The workload of benchmarks/routing.py (`make bench-routing`): two engine replicas with KV caches too
small for every shared prefix, PROMPTS_N ~1,000-token system prompts x USERS users, in rounds of a
new random order, CONCURRENCY in flight. Sent (a) through a Conduit shim with `--routing
cache_aware` (its approximate text-prefix view of each replica) and (b) through `smg launch
--policy cache_aware` with the engines as gRPC workers (vllm.grpc.engine: the gateway tokenizes and
applies the template itself, and knows each engine's cache exactly from its KV events). Each side
gets its own fresh system prompts. Reported as routing.py does: hit rate, TTFT p50/p99, tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb, vllm_engine_pb2_grpc as vpb_grpc

from benchmarks.routing import PolicyStats, markdown, run_policy, start_shim, workload
from launcher.stack import Stack
from launcher.smg_gateway import Gateway

SIDES = ("shim", "gateway")


def tokenizer_folder(engine: str) -> str:
    """Where the engine loaded its model from (the gateway reads the tokenizer there)."""
    with grpc.insecure_channel(engine) as channel:
        return vpb_grpc.VllmEngineStub(channel).GetModelInfo(vpb.GetModelInfoRequest(), timeout=10).tokenizer_path


async def run_side(side: str, base_url: str, index: int, args: argparse.Namespace) -> PolicyStats:
    warm = workload(10_000_000 + index, 2, 1)  # a first request per replica: nothing is cold but the cache
    await run_policy(side, base_url, warm, 2)
    stats = await run_policy(side, base_url, workload(args.seed + 1000 * (index + 1), args.prompts, args.users),
                             args.concurrency)
    print(markdown([stats], {"side": side}).splitlines()[-1], flush=True)
    return stats


def run(args: argparse.Namespace, engines: list[str]) -> list[PolicyStats]:
    stats = []
    for index, side in enumerate(args.sides):
        if side == "shim":
            shim, base_url = start_shim(",".join(engines), "cache_aware")
            try:
                stats.append(asyncio.run(run_side("shim cache_aware", base_url, index, args)))
            finally:
                shim.terminate()
                shim.wait(10)
        else:
            log = Path(tempfile.mkdtemp(prefix="conduit-bench-gateway-")) / "smg.log"
            with Gateway(engines, tokenizer_folder(engines[0]), log) as gateway:
                stats.append(asyncio.run(run_side("smg cache_aware (gRPC workers)", gateway.base_url, index, args)))
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", help="A,B: running replicas (default: start two here)")
    parser.add_argument("--kv-cache-tokens", type=int, default=10_000)
    parser.add_argument("--prompts", type=int, default=16, help="distinct ~1,000-token system prompts")
    parser.add_argument("--users", type=int, default=4, help="questions per system prompt (rounds)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    context = {"replicas": 2, "kv_cache_tokens": args.kv_cache_tokens, "system_prompts": args.prompts,
               "users_per_prompt": args.users, "concurrency": args.concurrency}
    if args.engines:
        stats = run(args, args.engines.split(","))
    else:
        with Stack(replicas=2, engine_args=["--kv-cache-tokens", str(args.kv_cache_tokens)],
                   startup_timeout=600) as stack:
            stats = run(args, stack.engine_addresses)
    print(markdown(stats, context))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"context": context, "sides": [asdict(s) for s in stats]}, indent=2))


if __name__ == "__main__":
    main()
