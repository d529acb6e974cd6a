"""Chaos: streaming load through one shim over two engine replicas while the engines are frozen
(SIGSTOP, then SIGCONT), killed and restarted at random, and clients drop streams mid-answer.

    python -m benchmarks.chaos [--seconds 180] [--streams 8] [--seed N]

It starts its own stack (two replicas of the default model behind one shim, the shim's default
keepalive). One disturbance at a time, a few seconds apart: a replica is frozen for 2-12 s, or
killed and restarted on its port. Each worker keeps one streamed chat in flight (closed loop); a
few of the streams are dropped by the client after some chunks. Every request must end: with
[DONE] (completed), with a clean error (an HTTP error status with an error body, or an SSE error
event and no [DONE]), or by the client's choice. One that sends no data for --hang-seconds (SSE
heartbeats do not count) is hung; one cut without an error event is broken. Exits 1 on any hung
or broken request, or any 500.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from benchmarks.soak import CHAT, MODEL
from launcher.stack import Stack

MAX_TOKENS = 48
DROP_EVERY = 7  # every 7th stream is dropped by its client after a few chunks
DROP_AFTER_CHUNKS = 3
# Statuses that are a clean refusal under chaos: no replica left (503), queue full (429), deadline (504).
CLEAN_STATUSES = frozenset({429, 503, 504})


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    dropped: int = 0  # by the client, on purpose
    clean_errors: Counter = field(default_factory=Counter)  # "503 engine_unavailable", "event engine_unavailable"
    hung: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    actions: Counter = field(default_factory=Counter)


def error_code(text: str) -> str:
    try:
        error = json.loads(text).get("error") or {}
    except (ValueError, AttributeError):
        return "unparsed"
    return str(error.get("code") or error.get("type") or "none")


async def one_stream(client: httpx.AsyncClient, k: int, tally: Tally, hang_s: float) -> None:
    tally.sent += 1
    body = {"model": MODEL, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0.7, "stream": True}
    drop = k % DROP_EVERY == DROP_EVERY - 1
    try:
        async with client.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                label = f"{response.status_code} {error_code(text)}"
                if response.status_code in CLEAN_STATUSES:
                    tally.clean_errors[label] += 1
                else:
                    tally.broken.append(label)
                return
            await read_events(response.aiter_lines(), k, drop, tally, hang_s)
    except httpx.HTTPError as error:  # the connection itself failed: not a clean end
        tally.broken.append(f"request {k}: transport error {error!r}")


async def read_events(lines, k: int, drop: bool, tally: Tally, hang_s: float) -> None:
    """One stream's SSE lines until [DONE], an error event, its drop, or hang_s without data."""
    chunks = 0
    deadline = time.monotonic() + hang_s
    while True:
        try:
            line = await asyncio.wait_for(anext(lines), max(deadline - time.monotonic(), 0.0))
        except StopAsyncIteration:
            tally.broken.append(f"request {k}: ended without [DONE] or an error event")
            return
        except TimeoutError:
            tally.hung.append(f"request {k}: no data for {hang_s:.0f} s after {chunks} chunks")
            return
        if not line.startswith("data: "):
            continue  # blank separators and heartbeat comments: not progress
        deadline = time.monotonic() + hang_s
        data = line[len("data: "):]
        if data == "[DONE]":
            tally.completed += 1
            return
        if data.startswith('{"error"'):
            code = error_code(data)
            if code == "internal_error":  # a bug, not a clean refusal
                tally.broken.append(f"request {k}: error event {data[:200]}")
            else:
                tally.clean_errors[f"event {code}"] += 1
            return
        chunks += 1
        if drop and chunks >= DROP_AFTER_CHUNKS:
            tally.dropped += 1
            return  # leaving closes the connection: the shim cancels the engine's work


async def load(base_url: str, streams: int, seconds: float, hang_s: float, tally: Tally) -> None:
    end = time.monotonic() + seconds
    counter = iter(range(10**9))
    # No client read timeout: the hang check above is the judge (heartbeats keep a read alive).
    timeout = httpx.Timeout(connect=30.0, read=None, write=30.0, pool=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        async def worker() -> None:
            while time.monotonic() < end:
                await one_stream(client, next(counter), tally, hang_s)

        await asyncio.gather(*(worker() for _ in range(streams)))


def disturb(stack: Stack, stop: threading.Event, rng: random.Random, tally: Tally) -> None:
    """One disturbance at a time until `stop`: freeze a replica for a while, or kill and restart it."""
    while not stop.wait(rng.uniform(3.0, 8.0)):
        index = rng.randrange(len(stack.engines))
        engine = stack.engines[index]
        if engine is None or engine.poll() is not None:
            continue
        if rng.random() < 0.6:
            frozen_s = rng.uniform(2.0, 12.0)
            print(f"chaos: freezing replica {index} for {frozen_s:.1f} s", flush=True)
            tally.actions["freeze"] += 1
            engine.send_signal(signal.SIGSTOP)
            try:
                stop.wait(frozen_s)
            finally:
                engine.send_signal(signal.SIGCONT)
        else:
            print(f"chaos: killing replica {index}, then restarting it", flush=True)
            tally.actions["kill+restart"] += 1
            engine.kill()
            engine.wait()
            stop.wait(rng.uniform(0.0, 3.0))
            stack.restart_engine(index)
            print(f"chaos: replica {index} is back", flush=True)


def report(tally: Tally, seconds: float, streams: int) -> str:
    failed = sum(tally.clean_errors.values())
    lines = [f"### Chaos: {seconds:.0f} s, {streams} streams in flight, two replicas",
             "", "| sent | completed | failed with a clean error | dropped by the client | hung | broken |",
             "| --- | --- | --- | --- | --- | --- |",
             f"| {tally.sent} | {tally.completed} | {failed} | {tally.dropped} | {len(tally.hung)} | "
             f"{len(tally.broken)} |", ""]
    lines.append("- disturbances: " + ", ".join(f"{name} x{n}" for name, n in sorted(tally.actions.items())))
    lines.append("- clean errors: " + (", ".join(f"{label} x{n}" for label, n in tally.clean_errors.most_common())
                                       or "none"))
    lines += [f"- hung: {problem}" for problem in tally.hung[:10]]
    lines += [f"- broken: {problem}" for problem in tally.broken[:10]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0, help="how long the load and the chaos run")
    parser.add_argument("--streams", type=int, default=8, help="streams kept in flight")
    parser.add_argument("--hang-seconds", type=float, default=60.0,
                        help="a stream without data this long is hung (the shim's keepalive bound is ~10 s)")
    parser.add_argument("--seed", type=int, default=None, help="the disturbances' random seed")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"chaos: seed {seed}", flush=True)
    tally = Tally()
    with Stack(replicas=2, log_dir=tempfile.mkdtemp(prefix="conduit-chaos-")) as stack:
        print(f"chaos: stack up ({stack.base_url}; logs in {stack.log_dir})", flush=True)
        stop = threading.Event()
        chaos = threading.Thread(target=disturb, args=(stack, stop, random.Random(seed), tally), daemon=True)
        chaos.start()
        try:
            asyncio.run(load(stack.base_url, args.streams, args.seconds, args.hang_seconds, tally))
        finally:
            stop.set()
            chaos.join()
            for engine in stack.engines:
                if engine is not None and engine.poll() is None:
                    engine.send_signal(signal.SIGCONT)
    print(report(tally, args.seconds, args.streams), flush=True)
    return 1 if tally.hung or tally.broken else 0


if __name__ == "__main__":
    sys.exit(main())
