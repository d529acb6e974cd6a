"""Where the time to first token of a lone short chat goes: shim, gRPC, template and tokenization,
waiting for the engine loop, the prefill step, the rest of the engine's servicer.

    python -m benchmarks.ttft_breakdown                  # starts its own stack (engine metrics on)
    python -m benchmarks.ttft_breakdown --samples 20 --engine-args "--max-step-tokens 256"

One request at a time, in rounds; each round times the same short chat (max_tokens 1, so the
first token is the prefill step's) through the shim and over gRPC, with the engine's own
histograms read around each request (`conduit:time_to_first_token_seconds`: arrival in the engine,
after tokenization, to the first token; `conduit:step_duration_seconds`: its one step), then a
`ListModels` round trip, a `Tokenize` call of the same messages (chat template + tokenization), and
a 2-token request (prefill plus one decode step). Stages are medians over the rounds:
- shim: the shim request's time outside the engine less the gRPC request's;
- gRPC round trip; chat template + tokenization (Tokenize less the round trip);
- the engine servicer: the gRPC request's time outside the engine less a Tokenize call;
- waiting for the engine loop (engine TTFT less its step); the prefill step.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from benchmarks.prompts import PROMPTS
from benchmarks.stats import RequestResult
from benchmarks.targets import SYSTEM_PROMPT, GrpcTarget, OpenAITarget
from launcher.stack import Stack, free_port
from conduit.v1 import engine_pb2, engine_pb2_grpc

# Rounds run first and not counted: every path warm.
WARM_UP_ROUNDS = 2
# The engine publishes its metrics once per step, after sending: wait this long before reading them.
PUBLISH_WAIT_S = 0.05


@dataclass
class Histograms:
    """Sums and counts of the engine histograms the breakdown reads."""

    ttft_sum: float
    ttft_count: float
    step_sum: float
    step_count: float

    def __sub__(self, other: Histograms) -> Histograms:
        return Histograms(self.ttft_sum - other.ttft_sum, self.ttft_count - other.ttft_count,
                          self.step_sum - other.step_sum, self.step_count - other.step_count)


def scrape(metrics_url: str) -> Histograms:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    return Histograms(total("conduit:time_to_first_token_seconds_sum"),
                      total("conduit:time_to_first_token_seconds_count"),
                      total("conduit:step_duration_seconds_sum"), total("conduit:step_duration_seconds_count"))


def chat_messages(prompt: str) -> list[engine_pb2.ChatMessage]:
    return [engine_pb2.ChatMessage(role="system", content=SYSTEM_PROMPT),
            engine_pb2.ChatMessage(role="user", content=prompt)]


async def timed_ms(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


@dataclass
class Sample:
    """One lone request: TTFT seen by the client, and the engine's histograms over it."""

    ttft_ms: float
    engine: Histograms

    @property
    def engine_ttft_ms(self) -> float:
        return 1000 * self.engine.ttft_sum

    @property
    def steps_ms(self) -> float:
        return 1000 * self.engine.step_sum


async def observed(send: Callable[[], Awaitable[RequestResult]], metrics_url: str) -> Sample | None:
    """Runs one request alone, with the engine's histograms read around it (None: no text came)."""
    before = scrape(metrics_url)
    result = await send()
    await asyncio.sleep(PUBLISH_WAIT_S)
    delta = scrape(metrics_url) - before
    if not (result.ok and result.text_times) or delta.ttft_count != 1:
        return None
    return Sample(result.text_times[0] * 1000, delta)


async def measure(base_url: str, engine: str, metrics_url: str, samples: int) -> dict[str, float]:
    """Medians over `samples` rounds; each round times the same chat through the shim and over
    gRPC (max_tokens 1: one prefill step), a round trip, a Tokenize call, and a 2-token request."""
    shim, direct = OpenAITarget("shim", base_url, 1), GrpcTarget("grpc", engine, 1)
    await shim.open()
    await direct.open()
    channel = grpc.aio.insecure_channel(engine)
    stub = engine_pb2_grpc.EngineStub(channel)
    via_shim: list[Sample] = []
    via_grpc: list[Sample] = []
    rtt_ms, tokenize_ms, two_steps_ms = [], [], []
    try:
        for i in range(samples + WARM_UP_ROUNDS):
            prompt = PROMPTS[i % len(PROMPTS)]
            shim_sample = await observed(lambda: shim.send(prompt), metrics_url)
            grpc_sample = await observed(lambda: direct.send(prompt), metrics_url)
            two = await observed(lambda: direct.send(prompt, max_tokens=2), metrics_url)
            rtt = await timed_ms(lambda: stub.ListModels(engine_pb2.ListModelsRequest()))
            tokenize = await timed_ms(lambda: stub.Tokenize(engine_pb2.TokenizeRequest(
                chat=engine_pb2.ChatInput(messages=chat_messages(prompt)))))
            if i < WARM_UP_ROUNDS or shim_sample is None or grpc_sample is None or two is None:
                continue
            via_shim.append(shim_sample)
            via_grpc.append(grpc_sample)
            two_steps_ms.append(two.steps_ms)
            rtt_ms.append(rtt)
            tokenize_ms.append(tokenize)
    finally:
        await channel.close()
        await shim.close()
        await direct.close()
    if not via_shim:
        raise RuntimeError("no round produced text through both paths")
    med = statistics.median
    both = via_shim + via_grpc
    return {
        "rounds counted": len(via_shim),
        "shim TTFT": med(s.ttft_ms for s in via_shim),
        "gRPC TTFT": med(s.ttft_ms for s in via_grpc),
        "shim TTFT outside the engine": med(s.ttft_ms - s.engine_ttft_ms for s in via_shim),
        "gRPC TTFT outside the engine": med(s.ttft_ms - s.engine_ttft_ms for s in via_grpc),
        "round trip (ListModels)": med(rtt_ms),
        "Tokenize call": med(tokenize_ms),
        "engine TTFT": med(s.engine_ttft_ms for s in both),
        "engine wait before its step": med(s.engine_ttft_ms - s.steps_ms for s in both),
        "prefill step": med(s.steps_ms for s in both),
        "decode step": med(two_steps_ms) - med(s.steps_ms for s in both),
    }


def breakdown(f: dict[str, float]) -> list[tuple[str, float]]:
    """The shim TTFT cut into stages (medians of each, so the sum is close to, not exactly, the
    median TTFT)."""
    return [
        ("shim (HTTP, JSON, SSE, the HTTP client)", f["shim TTFT outside the engine"] - f["gRPC TTFT outside the engine"]),
        ("gRPC round trip", f["round trip (ListModels)"]),
        ("chat template + tokenization", f["Tokenize call"] - f["round trip (ListModels)"]),
        ("engine servicer (submit, grammar hop, encode, hand-off)",
         f["gRPC TTFT outside the engine"] - f["Tokenize call"]),
        ("waiting for the engine loop", f["engine wait before its step"]),
        ("prefill step (schedule, forward, sample, send)", f["prefill step"]),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ttft_breakdown", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--engine-args", default="", help='extra engine flags, e.g. "--max-step-tokens 256"')
    args = p.parse_args(argv)
    metrics_port = free_port()
    with Stack(engine_args=shlex.split(args.engine_args), metrics_port=metrics_port) as stack:
        figures = asyncio.run(measure(stack.base_url, stack.engine_address,
                                      f"http://127.0.0.1:{metrics_port}/metrics", args.samples))
    print(f"lone short chat, {args.samples} rounds, engine flags: {args.engine_args or 'defaults'}")
    for name, value in figures.items():
        print(f"  {name:<40} {value:8.1f}")
    print("breakdown of the shim TTFT (ms):")
    for name, value in breakdown(figures):
        print(f"  {name:<56} {value:7.1f}")
    print(f"  {'sum of the stages':<56} {sum(v for _, v in breakdown(figures)):7.1f}")
    print(f"one prefill plus one decode step: {figures['prefill step'] + figures['decode step']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
