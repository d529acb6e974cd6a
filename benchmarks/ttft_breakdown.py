"""Where the time to first token of a lone short chat goes: shim, gRPC, template and tokenization,
waiting for the engine loop, the prefill step, the rest of the engine's servicer.

    python -m benchmarks.ttft_breakdown                  # starts its own stack (engine metrics on)
    python -m benchmarks.ttft_breakdown --samples 20 --engine-args "--max-step-tokens 256"

One request at a time, each measured from outside or from the engine's own metrics:
- shim TTFT: openai SDK -> shim -> engine, send to first text chunk (as the bench measures it);
- gRPC TTFT: the same chat over `Generate` directly;
- round trip: a `ListModels` call (gRPC transport plus a trivial handler);
- template + tokenization: a `Tokenize` call of the same messages, less the round trip;
- engine TTFT: `conduit:time_to_first_token_seconds` (arrival in the engine, after tokenization,
  to the first token), averaged over requests from the histogram's sum and count;
- prefill step: `conduit:step_duration_seconds` over requests with max_tokens 1 (one step each:
  schedule, forward, sample, send); a decode step: the extra step time of max_tokens 2.
Client-side figures are medians; engine figures are means (histograms keep sums, not samples).
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
from benchmarks.targets import SYSTEM_PROMPT, GrpcTarget, OpenAITarget
from clients.launch import Stack, free_port
from conduit.v1 import engine_pb2, engine_pb2_grpc

# Max tokens of the timed chats: short answers; TTFT only needs the first.
MAX_TOKENS = 8


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


async def engine_only(stub: engine_pb2_grpc.EngineStub, metrics_url: str, max_tokens: int,
                      samples: int) -> tuple[float, float, float]:
    """Mean engine TTFT (ms), mean step time per request (ms) and steps per request, for lone
    requests of `max_tokens` over gRPC."""
    before = scrape(metrics_url)
    for i in range(samples):
        request = engine_pb2.GenerateRequest(
            chat=engine_pb2.ChatInput(messages=chat_messages(PROMPTS[i % len(PROMPTS)])),
            sampling=engine_pb2.SamplingParams(temperature=0.0),
            stopping=engine_pb2.StoppingParams(max_tokens=max_tokens))
        async for _ in stub.Generate(request):
            pass
    await asyncio.sleep(0.2)  # the engine publishes its metrics once per step, after sending
    delta = scrape(metrics_url) - before
    return (1000 * delta.ttft_sum / delta.ttft_count, 1000 * delta.step_sum / samples,
            delta.step_count / samples)


async def measure(base_url: str, engine: str, metrics_url: str, samples: int) -> dict[str, float]:
    shim, direct = OpenAITarget("shim", base_url, MAX_TOKENS), GrpcTarget("grpc", engine, MAX_TOKENS)
    await shim.open()
    await direct.open()
    channel = grpc.aio.insecure_channel(engine)
    stub = engine_pb2_grpc.EngineStub(channel)
    shim_ms, grpc_ms, rtt_ms, tokenize_ms = [], [], [], []
    try:
        for i in range(samples + 2):  # the first two warm every path up and are not counted
            prompt = PROMPTS[i % len(PROMPTS)]
            results = [await shim.send(prompt), await direct.send(prompt)]
            rtt = await timed_ms(lambda: stub.ListModels(engine_pb2.ListModelsRequest()))
            tokenize = await timed_ms(lambda: stub.Tokenize(engine_pb2.TokenizeRequest(
                chat=engine_pb2.ChatInput(messages=chat_messages(prompt)))))
            if i < 2:
                continue
            if not all(r.ok and r.text_times for r in results):
                raise RuntimeError(f"a request failed: {[r.error for r in results]}")
            shim_ms.append(results[0].text_times[0] * 1000)
            grpc_ms.append(results[1].text_times[0] * 1000)
            rtt_ms.append(rtt)
            tokenize_ms.append(tokenize)
        engine_ttft, prefill_step, prefill_steps = await engine_only(stub, metrics_url, 1, samples)
        _, two_steps, _ = await engine_only(stub, metrics_url, 2, samples)
    finally:
        await channel.close()
        await shim.close()
        await direct.close()
    med = statistics.median
    figures = {"shim TTFT": med(shim_ms), "gRPC TTFT": med(grpc_ms), "round trip": med(rtt_ms),
               "Tokenize call": med(tokenize_ms), "engine TTFT": engine_ttft,
               "prefill step": prefill_step, "steps per 1-token request": prefill_steps,
               "decode step": two_steps - prefill_step}
    return figures


def breakdown(f: dict[str, float]) -> list[tuple[str, float]]:
    """The shim TTFT cut into stages that add up to it."""
    template = f["Tokenize call"] - f["round trip"]
    servicer = f["gRPC TTFT"] - f["round trip"] - template - f["engine TTFT"]
    return [
        ("shim (HTTP, JSON, SSE, openai SDK)", f["shim TTFT"] - f["gRPC TTFT"]),
        ("gRPC round trip", f["round trip"]),
        ("chat template + tokenization", template),
        ("engine servicer (submit, grammar hop, encode, hand-off)", servicer),
        ("waiting for the engine loop", f["engine TTFT"] - f["prefill step"]),
        ("prefill step (schedule, forward, sample)", f["prefill step"]),
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
    print(f"lone short chat, {args.samples} samples, max_tokens {MAX_TOKENS}, "
          f"engine flags: {args.engine_args or 'defaults'}")
    for name, value in figures.items():
        print(f"  {name:<40} {value:8.1f}")
    print("breakdown of the shim TTFT (ms):")
    for name, value in breakdown(figures):
        print(f"  {name:<56} {value:7.1f}")
    print(f"  {'total':<56} {figures['shim TTFT']:7.1f}")
    print(f"one prefill plus one decode step: {figures['prefill step'] + figures['decode step']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
