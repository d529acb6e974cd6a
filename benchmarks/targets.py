"""The two ways a request reaches a server: the OpenAI protocol (shim or peer) and Conduit's gRPC.

Each target streams one chat completion per `send` and records when text arrived; they share
one system message (or none: the short-chat workload) so every server renders the same prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from conduit.v1 import engine_pb2, engine_pb2_grpc

from benchmarks.prompts import PROMPTS, QUOTE_PROMPTS
from benchmarks.stats import RequestResult

if TYPE_CHECKING:
    import aiohttp

SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(frozen=True)
class Workload:
    system: str  # the system message each request carries ("" for none)
    prompts: tuple[str, ...]  # the users' turns, taken in turn


WORKLOADS = {"chat": Workload(SYSTEM_PROMPT, PROMPTS), "short-chat": Workload("", PROMPTS),
             "quote": Workload(SYSTEM_PROMPT, QUOTE_PROMPTS)}


def chat_messages(system: str, prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}] * bool(system) + [{"role": "user", "content": prompt}]


class OpenAITarget:
    """Streams chat completions through an OpenAI-compatible server, usage chunk included.

    The client is aiohttp reading the SSE lines itself, as vLLM's serving benchmark does, not the
    openai SDK: the SDK's per-request and per-chunk work (httpx, a pydantic object per chunk) took
    ~6% of a core at 32 streams against the gRPC client's ~2%, and on 2 cores a client's CPU is taken
    from the server it measures. The SDK's fidelity is what the tests check, not this.
    """

    def __init__(self, name: str, base_url: str, max_tokens: int, api_key: str = "bench",
                 system: str = SYSTEM_PROMPT) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.system = system
        self.session: aiohttp.ClientSession | None = None
        self.failures: tuple[type[BaseException], ...] = ()  # what a failed request raises
        self.model = ""
        self.extra_body: dict = {}  # more fields for every request (e.g. vLLM's ignore_eos)

    async def open(self) -> None:
        # Imported here: the fast tier imports this module (tests/test_bench_turns.py) from the offline
        # install's `check` set, which has no aiohttp; only a benchmark run needs it (`dev`).
        import aiohttp

        self.failures = (aiohttp.ClientError, asyncio.TimeoutError, ValueError)
        # One connection per request: reusing an idle keep-alive connection races the server
        # closing it (llama-server does after 5 s), which fails a request with "Server disconnected".
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=aiohttp.ClientTimeout(total=600))
        self.model = (await self.model_ids())[0]

    async def model_ids(self) -> list[str]:
        assert self.session is not None, "open() first"
        async with self.session.get(f"{self.base_url}/models") as response:
            response.raise_for_status()
            return [model["id"] for model in (await response.json())["data"]]

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def send(self, prompt: str, max_tokens: int | None = None, system: str | None = None) -> RequestResult:
        """`system`: this request's system message instead of the target's ("" for none)."""
        assert self.session is not None, "open() first"
        body = {
            "model": self.model,
            "messages": chat_messages(self.system if system is None else system, prompt),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }
        start = time.perf_counter()
        result = RequestResult(ok=False)
        text_chunks = 0
        usage_tokens: int | None = None
        try:
            async with self.session.post(f"{self.base_url}/chat/completions", json=body) as response:
                if response.status != 200:
                    result.error = f"HTTP {response.status}: {(await response.text())[:250]}"
                    return result
                async for line in response.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        result.error = f"stream error: {json.dumps(chunk['error'])[:250]}"
                        return result
                    choices = chunk.get("choices")
                    if choices and choices[0].get("delta", {}).get("content"):
                        result.text_times.append(time.perf_counter() - start)
                        text_chunks += 1
                    usage = chunk.get("usage")
                    if usage:
                        usage_tokens = usage["completion_tokens"]
                        result.prompt_tokens = usage["prompt_tokens"]
                    cached = _cached_tokens(chunk)
                    if cached is not None:
                        result.cached_tokens = cached
        except self.failures as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
            return result
        result.ok = True
        result.latency = time.perf_counter() - start
        # A server that sends no usage gets one token per text chunk (llama-server streams per token).
        result.completion_tokens = usage_tokens if usage_tokens is not None else text_chunks
        return result


def _cached_tokens(chunk: dict) -> int | None:
    """Prompt tokens served from a prompt cache: OpenAI's usage.prompt_tokens_details.cached_tokens,
    or llama-server's `timings.cache_n` (it reports its cache there); None when neither is sent."""
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return details["cached_tokens"]
    timings = chunk.get("timings")
    return timings.get("cache_n") if isinstance(timings, dict) else None


class GrpcTarget:
    """Calls conduit.v1.Engine/Generate directly, so the shim's own cost can be seen."""

    def __init__(self, name: str, address: str, max_tokens: int, system: str = SYSTEM_PROMPT) -> None:
        self.name = name
        self.address = address
        self.max_tokens = max_tokens
        self.system = system
        self.channel: grpc.aio.Channel | None = None
        self.stub: engine_pb2_grpc.EngineStub | None = None

    async def open(self) -> None:
        # Created here because a grpc.aio channel binds to the running event loop.
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        await self.channel.channel_ready()

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = self.stub = None

    async def model_info(self) -> engine_pb2.ModelInfo:
        async with grpc.aio.insecure_channel(self.address) as channel:
            models = await engine_pb2_grpc.EngineStub(channel).ListModels(
                engine_pb2.ListModelsRequest(), timeout=10)
        return models.models[0]

    async def send(self, prompt: str, max_tokens: int | None = None) -> RequestResult:
        assert self.stub is not None, "open() first"
        request = engine_pb2.GenerateRequest(
            chat=engine_pb2.ChatInput(
                messages=[engine_pb2.ChatMessage(**m) for m in chat_messages(self.system, prompt)]
            ),
            sampling=engine_pb2.SamplingParams(temperature=0.0),
            stopping=engine_pb2.StoppingParams(max_tokens=max_tokens or self.max_tokens),
        )
        start = time.perf_counter()
        result = RequestResult(ok=False)
        try:
            async for response in self.stub.Generate(request):
                kind = response.WhichOneof("kind")
                if kind == "chunk" and response.chunk.text:
                    result.text_times.append(time.perf_counter() - start)
                elif kind == "final":
                    result.completion_tokens = response.final.completion_tokens
        except grpc.aio.AioRpcError as exc:
            result.error = f"{exc.code().name}: {exc.details()}"[:200]
            return result
        result.ok = True
        result.latency = time.perf_counter() - start
        return result
