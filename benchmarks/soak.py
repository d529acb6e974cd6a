"""Soak: a bounded mixed load through the shim, at 4x and then 10x the engine's batch size in flight.

    python -m benchmarks.soak [--base-url URL --engine-pid P --shim-pid P] [--seconds 90] [--batch-size 32]

Without --base-url it starts its own stack. Each phase keeps `multiple x batch size` requests in
flight (closed loop) for `--seconds`, drawing classes round-robin: streamed and whole chats, streams
cancelled mid-answer, invalid and over-limit requests, n>1, forced tool calls and JSON schema. It
reports per-class counts by status, any unexpected status (a 5xx, a 429 without Retry-After, an
error where none belongs, a stream without [DONE]), p50/p99 latency, and the processes' RSS before
and after each phase. Exits 1 when anything unexpected was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections import Counter, defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from launcher.stack import Stack

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "weather for a city",
                                          "parameters": SCHEMA}}]
MAX_TOKENS = 24


@dataclass
class Klass:
    """A class of request: its body, whether it streams or is cut mid-stream, the statuses it may get."""

    name: str
    body: dict[str, Any]
    stream: bool = False
    cancel_after_chunks: int = 0
    expected: frozenset[int] = frozenset({200, 429})


CLASSES = [
    Klass("chat", {"messages": CHAT, "max_tokens": MAX_TOKENS}),
    Klass("chat_stream", {"messages": CHAT, "max_tokens": MAX_TOKENS, "stream": True}, stream=True),
    Klass("cancelled_stream", {"messages": CHAT, "max_tokens": 200, "stream": True}, stream=True,
          cancel_after_chunks=3),
    Klass("invalid", {"messages": CHAT, "temperature": 7}, expected=frozenset({400})),
    Klass("over_limit", {"messages": [{"role": "user", "content": "word " * 20000}]}, expected=frozenset({400})),
    Klass("n3", {"messages": CHAT, "max_tokens": MAX_TOKENS, "n": 3}),
    Klass("tools", {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
                    "tool_choice": "required", "max_tokens": 40}),
    Klass("json_schema", {"messages": CHAT, "max_tokens": 40, "response_format": {
        "type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}}),
]


@dataclass
class Phase:
    in_flight: int
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    unexpected: list[str] = field(default_factory=list)


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def one_request(client: httpx.AsyncClient, klass: Klass, phase: Phase) -> None:
    body = {"model": MODEL, "temperature": 0.7, **klass.body}
    started = time.perf_counter()
    problem = ""
    try:
        if klass.stream:
            async with client.stream("POST", "/chat/completions", json=body) as response:
                status = response.status_code
                if status == 200:
                    problem = await read_stream(response, klass)
                else:
                    await response.aread()
        else:
            response = await client.post("/chat/completions", json=body)
            status = response.status_code
    except httpx.HTTPError as error:
        status, problem = 0, f"transport error {error!r}"
    phase.latencies[klass.name].append(time.perf_counter() - started)
    phase.statuses[klass.name][status] += 1
    if status not in klass.expected:
        problem = problem or f"status {status}: {response.text[:200] if not klass.stream else ''}"
    elif status == 429 and "retry-after" not in {k.lower() for k in response.headers}:
        problem = "429 without Retry-After"
    if problem:
        phase.unexpected.append(f"{klass.name}: {problem}")


async def read_stream(response: httpx.Response, klass: Klass) -> str:
    """'' when the stream behaved: [DONE] at its end, or cut by us after a few chunks."""
    chunks = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            return ""
        if '"error"' in data and json.loads(data).get("error"):
            return f"error event {data[:200]}"
        chunks += 1
        if klass.cancel_after_chunks and chunks >= klass.cancel_after_chunks:
            return ""  # leaving the block closes the connection: the shim must cancel the engine's work
    return "stream ended without [DONE]"


async def run_phase(base_url: str, api_key: str, in_flight: int, seconds: float) -> Phase:
    phase = Phase(in_flight)
    deadline = time.monotonic() + seconds
    classes = itertools.cycle(CLASSES)
    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300, limits=limits) as client:
        async def worker() -> None:
            while time.monotonic() < deadline:
                await one_request(client, next(classes), phase)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return phase


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(phase: Phase, rss_before: dict[str, float | None], rss_after: dict[str, float | None]) -> str:
    lines = [f"### {phase.in_flight} in flight", "",
             "| class | requests | statuses | p50 s | p99 s |", "| --- | --- | --- | --- | --- |"]
    for klass in CLASSES:
        counts = phase.statuses.get(klass.name, Counter())
        latencies = phase.latencies.get(klass.name, [])
        shown = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
        lines.append(f"| {klass.name} | {sum(counts.values())} | {shown} | {percentile(latencies, 0.5):.2f} | "
                     f"{percentile(latencies, 0.99):.2f} |")
    lines.append("")
    for name in rss_before:
        before, after = rss_before[name], rss_after[name]
        if before and after:
            lines.append(f"- {name} RSS: {before:.0f} MB -> {after:.0f} MB ({(after / before - 1) * 100:+.1f}%)")
    lines.append(f"- unexpected: {len(phase.unexpected)}")
    lines += [f"  - {problem}" for problem in phase.unexpected[:20]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running shim's /v1 URL; default: start a stack")
    parser.add_argument("--engine-pid", type=int)
    parser.add_argument("--shim-pid", type=int)
    parser.add_argument("--api-key", default="soak")
    parser.add_argument("--batch-size", type=int, default=32, help="the engine's --max-batch-size")
    parser.add_argument("--multiples", default="4,10", help="in-flight requests as multiples of the batch size")
    parser.add_argument("--seconds", type=float, default=90, help="per phase")
    parser.add_argument("--warmup-seconds", type=float, default=20)
    args = parser.parse_args()
    stack = nullcontext() if args.base_url else Stack(engine_args=["--max-batch-size", str(args.batch_size)])
    with stack as running:
        base_url = args.base_url or running.base_url
        pids = {"engine": args.engine_pid, "shim": args.shim_pid}
        if running is not None:
            pids = {"engine": running.engine.pid, "shim": running.shim.pid}
        # Warm-up at the first level, so RSS growth measures the steady state, not first allocations.
        asyncio.run(run_phase(base_url, args.api_key, args.batch_size * 4, args.warmup_seconds))
        sections, unexpected = [], 0
        for multiple in (int(m) for m in args.multiples.split(",")):
            before = {name: rss_mb(pid) for name, pid in pids.items()}
            phase = asyncio.run(run_phase(base_url, args.api_key, args.batch_size * multiple, args.seconds))
            after = {name: rss_mb(pid) for name, pid in pids.items()}
            sections.append(report(phase, before, after))
            unexpected += len(phase.unexpected)
            print(sections[-1], "\n", flush=True)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
