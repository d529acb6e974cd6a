"""A scripted asyncio Engine servicer on the engine's own gRPC server (engine_service/serving/
background.py), for tests of the HTTP shim alone. GenerateMany runs this fake's Generate through the
engine's own code (engine_service/serving/many.py), so the shim's relay meets the real framing.

The script is chosen by the input's last text (the last chat message, or the prompt):
  "echo-request"        the output text is the received GenerateRequest as JSON
  "error:CODE:message"  the call fails with grpc.StatusCode.CODE before any response
  "bad-field:PATH"      INVALID_ARGUMENT naming the GenerateRequest field PATH (trailing metadata)
  "too-long:N"          the real engine's refusal of an N-token prompt on a 64-token context
  "midstream-error"     PromptInfo and one chunk, then INTERNAL
  "hang"                PromptInfo, then nothing until the caller cancels
  "slow:SECONDS"        PromptInfo, a pause, then the default answer
  "long:N"              N tokens, 20 ms apart (for disconnects mid-stream)
  "tools"               a streamed get_weather tool call, finish TOOL_CALLS ("tools:NAME": a call to NAME)
  "search:QUERY"        a call to file_search with {"query": QUERY} (the Responses API's file_search tool);
                        a tool answer of passages (the last message) is answered with its first passage's text
  "call:NAME:ARGS"      a call to NAME with the arguments ARGS (JSON); any other tool answer (the last message,
                        from a tool) is answered "The tool said: " and its text (the MCP tests')
  "unicode"             multi-byte text
  "markdown"            MARKDOWN_ANSWER (Markdown, code blocks and HTML that must not run), in pieces
  anything else         "Hello from choice {i}." in five tokens, honouring max_tokens
It records every request, the call metadata each came with (by request id), and which ones were
cancelled (written on the server's thread, read on the tests': appends and single assignments), and
its health status can be flipped and it can be made to refuse every call (`refuse`, a status code,
as a full or going engine does); GetLoad reports its open calls (and `queued`, set by a test).
`start_shim` runs the real shim as a process against any engine
address; `start_fake_engine_process` runs this fake as a process of its own (`python
tests/fake_engine.py --port N`, forked as the shims are: forked.py), for tests that kill the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import types
import zlib
from pathlib import Path
from typing import IO
from collections.abc import AsyncIterator, Iterator

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2

import forked
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc
from conduit.v1.contract import ENGINE_SERVICE, ERROR_CODE_METADATA_KEY, PARAM_METADATA_KEY
from engine_service.core.admission import Admission
from engine_service.core.params import InvalidRequest
from engine_service.serving.background import BackgroundServer
from engine_service.serving.many import ManyCalls

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_ID = "fake-model"
MODEL_CREATED = 1_700_000_000
EMBEDDER_ID = "fake-embedder"  # a fake serving this id embeds words (word_vector) and reads 64 tokens
EMBEDDER_WINDOW = 64
EMBEDDER_DIMENSIONS = 64
PASSAGES_ANSWER = "Passages from the user's files:"  # how the shim's file_search answers the model
REFUSED_INPUT = "refuse me"  # a text Embed refuses with INVALID_ARGUMENT naming its inputs[i]
# For the playground's tests: Markdown to render, and markup that must show as text and never run.
MARKDOWN_ANSWER = (
    "## A **bold** answer\n\n"
    "Some *italic* text, `inline <b>code</b>` and a [link](https://example.com/docs).\n\n"
    "- first item\n- second item\n\n"
    "```html\n<script>window.injected = 'code block'</script>\n```\n\n"
    "<script>window.injected = 'answer'</script>\n"
    "<img src=x onerror=\"window.injected = 'img'\"> [bad link](javascript:window.injected='link')"
)


def _script_text(request: pb.GenerateRequest) -> str:
    kind = request.WhichOneof("input")
    if kind == "chat":
        return request.chat.messages[-1].content if request.chat.messages else ""
    if kind == "text":
        return request.text
    return "tokens"


def word_vector(text: str) -> list[float]:
    """A deterministic bag-of-words vector: each lower-cased word (letters and digits) adds 1 to the
    dimension its CRC-32 picks, so texts sharing words are near, for retrieval tests without a model."""
    values = [0.0] * EMBEDDER_DIMENSIONS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        values[zlib.crc32(word.encode()) % EMBEDDER_DIMENSIONS] += 1.0
    return values


def _logprob(token_id: int, token: str, value: float, top: int) -> pb.TokenLogprob:
    alternatives = [
        pb.TopLogprob(
            token_id=token_id + k, token=f"{token}#{k}" if k else token, logprob=value - k, bytes=token.encode()
        )
        for k in range(top)
    ]
    return pb.TokenLogprob(
        token_id=token_id, token=token, logprob=value, bytes=token.encode(), top_logprobs=alternatives
    )


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, model_id: str = MODEL_ID) -> None:
        self.model_id = model_id
        self.requests: list[pb.GenerateRequest] = []
        self.metadata: dict[str, dict[str, str]] = {}  # request_id -> the call's invocation metadata
        self.cancelled: list[str] = []
        self.serving = True  # as its health says (set_serving); GetLoad reports draining when not
        self.running = 0  # Generate calls open now: the load GetLoad reports
        self.queued = 0  # waiting requests GetLoad adds (as if other shims kept this replica busy)
        self.refuse: grpc.StatusCode | None = None  # every call fails with it before any response
        self.list_failures = 0  # ListModels calls that fail first (an engine just up, too busy to answer)
        self.embed_calls: list[int] = []  # each Embed call's number of inputs
        self.embed_priorities: list[int] = []  # and its priority (interactive or batch)
        self.embed_gate = threading.Event()  # Embed calls wait while it is clear
        self.embed_gate.set()

    # -------------------------------------------------------------- observation

    def wait_cancelled(self, request_id_prefix: str, timeout_s: float = 10.0) -> bool:
        """True once a request whose id starts with the prefix has been seen cancelled."""
        deadline = time.monotonic() + timeout_s
        while not any(r.startswith(request_id_prefix) for r in self.cancelled):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # -------------------------------------------------------------- RPCs

    async def ListModels(self, request, context):
        if self.list_failures > 0:
            self.list_failures -= 1
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the fake engine is too busy to answer in time")
        return pb.ListModelsResponse(models=[self._info()])

    async def GetModelInfo(self, request, context):
        if request.model != self.model_id:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")
        return self._info()

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        """One token per word of the chat's contents (or the text)."""
        if request.model and request.model != self.model_id:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} is not served here")
        words = (" ".join(m.content for m in request.chat.messages) if request.HasField("chat") else request.text).split()
        return pb.TokenizeResponse(token_ids=list(range(len(words))), tokens=words, max_context_length=2048)

    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:
        return pb.DetokenizeResponse(text=" ".join(f"w{t}" for t in request.token_ids))

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        """A 4-dimensional vector per input, from its length; refuses what the real engine refuses first."""
        if request.model and request.model != self.model_id:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} is not served here")
        if request.HasField("dimensions") and request.dimensions != 4:
            context.set_trailing_metadata([(PARAM_METADATA_KEY, "dimensions")])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "dimensions must be 4")
        self.embed_calls.append(len(request.inputs))
        self.embed_priorities.append(request.priority)
        while not self.embed_gate.is_set():
            await asyncio.sleep(0.01)
        for i, item in enumerate(request.inputs):
            if item.text == REFUSED_INPUT:  # as the real engine refuses an over-long input: naming it
                context.set_trailing_metadata([(PARAM_METADATA_KEY, f"inputs[{i}]")])
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"inputs[{i}] is refused")
        sizes = [len(i.text.split()) if i.HasField("text") else len(i.token_ids.ids) for i in request.inputs]
        if self.model_id == EMBEDDER_ID:
            return pb.EmbedResponse(model=self.model_id, prompt_tokens=sum(sizes), embeddings=[
                pb.Embedding(values=word_vector(i.text), prompt_tokens=n) for i, n in zip(request.inputs, sizes)])
        return pb.EmbedResponse(model=self.model_id, prompt_tokens=sum(sizes), embeddings=[
            pb.Embedding(values=[1.0, n / 10, 0.0, -1.0], prompt_tokens=n) for n in sizes])

    def _info(self) -> pb.ModelInfo:
        window = EMBEDDER_WINDOW if self.model_id == EMBEDDER_ID else 2048
        return pb.ModelInfo(id=self.model_id, source="fake", max_context_length=window, vocab_size=1000, created=MODEL_CREATED)

    async def Generate(self, request: pb.GenerateRequest, context) -> AsyncIterator[pb.GenerateResponse]:
        # The metadata first: a test that sees the request finds its metadata.
        self.metadata[request.request_id] = {k: v for k, v in context.invocation_metadata() or ()
                                             if isinstance(v, str)}
        self.requests.append(request)
        self.running += 1
        try:
            async for response in self._generate(request, context):
                yield response
        # Cancelled while waiting, or (a plain Generate) dropped unfinished by grpc while it sent.
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(request.request_id)
            raise
        finally:
            self.running -= 1

    async def GetLoad(self, request, context):
        return pb.LoadReport(running_requests=self.running, waiting_requests=self.queued,
                             kv_cache_usage=min(self.running / 16, 1.0), block_size=16, num_blocks=1024,
                             prefix_caching=True, draining=not self.serving, model=self.model_id)

    async def GenerateMany(self, requests, context):
        # This fake never drains: a stream ends when its caller half-closes it.
        async for response in ManyCalls(self.Generate, context, lambda: False).responses(requests):
            yield response

    async def _generate(self, request: pb.GenerateRequest, context) -> AsyncIterator[pb.GenerateResponse]:
        rid = request.request_id
        script = _script_text(request)
        if request.model and request.model != self.model_id:  # as the real engine answers
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} is not served here")
        if self.refuse is not None:
            await context.abort(self.refuse, "refused by the test")
        if script.startswith("error:"):
            _, code, message = script.split(":", 2)
            await context.abort(grpc.StatusCode[code], message)
        if script.startswith("bad-field:"):
            path = script.split(":", 1)[1]
            context.set_trailing_metadata(((PARAM_METADATA_KEY, path),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the engine refuses {path}")
        if script.startswith("too-long:"):
            prompt = types.SimpleNamespace(prompt_ids=[1] * int(script.split(":")[1]), inputs=None)  # not an Embed
            try:
                Admission(max_model_len=64, kv_capacity_tokens=64, vocab_size=100, max_batch_size=1).check(prompt)
            except InvalidRequest as exc:  # as the engine's servicer words it (serving/server.py)
                context.set_trailing_metadata(((PARAM_METADATA_KEY, "chat.messages"),
                                               (ERROR_CODE_METADATA_KEY, exc.code)))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        n = request.n if request.HasField("n") else 1
        prompt_tokens = len(script.split()) or 1
        yield pb.GenerateResponse(request_id=rid, prompt=self._prompt_info(request, script, prompt_tokens))
        if script == "hang":
            await asyncio.Event().wait()  # until the call is cancelled
        if script.startswith("slow:"):
            await asyncio.sleep(float(script.split(":")[1]))
        if script == "midstream-error":
            yield pb.GenerateResponse(
                request_id=rid,
                chunk=pb.Chunk(index=0, text="partial", prompt_tokens=prompt_tokens, completion_tokens=1),
            )
            await context.abort(grpc.StatusCode.INTERNAL, "the fake engine broke mid-stream")
        if script == "tools" or script.startswith("tools:"):
            for response in self._tool_call(rid, prompt_tokens, script[6:] or "get_weather"):
                yield response
            return
        if script.startswith("call:"):
            _, name, arguments = script.split(":", 2)
            for response in self._tool_call(rid, prompt_tokens, name, arguments):
                yield response
            return
        if script.startswith("search:"):
            arguments = json.dumps({"query": script[7:]})
            for response in self._tool_call(rid, prompt_tokens, "file_search", arguments):
                yield response
            return
        for i in range(n):
            tokens = self._tokens(request, script, i)
            limit = request.stopping.max_tokens if request.stopping.HasField("max_tokens") else len(tokens)
            emitted = tokens[:limit]
            for k, token in enumerate(emitted):
                if script.startswith("long:"):
                    await asyncio.sleep(0.02)
                chunk = pb.Chunk(
                    index=i, text=token, token_ids=[100 + k], prompt_tokens=prompt_tokens, completion_tokens=k + 1
                )
                if request.logprobs:
                    chunk.logprobs.append(_logprob(100 + k, token, -0.5 * (k + 1) - 0.25 * i, request.top_logprobs))
                yield pb.GenerateResponse(request_id=rid, chunk=chunk)
            reason = pb.FINISH_REASON_LENGTH if len(emitted) < len(tokens) else pb.FINISH_REASON_STOP
            yield pb.GenerateResponse(
                request_id=rid,
                final=pb.Final(
                    index=i, finish_reason=reason, prompt_tokens=prompt_tokens, completion_tokens=len(emitted)
                ),
            )

    # -------------------------------------------------------------- scripts

    def _prompt_info(self, request: pb.GenerateRequest, script: str, prompt_tokens: int) -> pb.PromptInfo:
        info = pb.PromptInfo(prompt_tokens=prompt_tokens)
        if request.echo:
            words = script.split(" ")
            info.prompt_text = script
            info.prompt_token_ids.extend(range(len(words)))
            if request.logprobs:
                for k, word in enumerate(words):
                    token = word if k == 0 else " " + word
                    info.prompt_logprobs.append(
                        _logprob(k, token, float("nan") if k == 0 else -1.0, request.top_logprobs)
                    )
        return info

    def _tokens(self, request: pb.GenerateRequest, script: str, choice: int) -> list[str]:
        if script == "echo-request":
            return [json.dumps(MessageToDict(request, preserving_proto_field_name=True))]
        if script == "unicode":
            return ["héllo", " 世界", " 🚀"]
        if script == "markdown":
            return [MARKDOWN_ANSWER[k : k + 16] for k in range(0, len(MARKDOWN_ANSWER), 16)]
        if script.startswith("long:"):
            return [f" t{k}" for k in range(int(script.split(":")[1]))]
        if script.startswith(PASSAGES_ANSWER):  # quote the first passage (its line after "[1] NAME:")
            passage = script.split("\n")[3] if script.count("\n") >= 3 else "nothing"
            return [f"{word} " for word in passage.split()[:40]]
        messages = request.chat.messages if request.WhichOneof("input") == "chat" else []
        if messages and messages[-1].role == "tool":
            return ["The tool said: ", script]
        return ["Hello", " from", " choice", f" {choice}", "."]

    def _tool_call(self, rid: str, prompt_tokens: int, name: str,
                   arguments: str = '{"city": "Paris"}') -> Iterator[pb.GenerateResponse]:
        half = len(arguments) // 2
        pieces = [
            pb.ToolCallDelta(index=0, id="call_fake1", name=name, arguments=arguments[:half]),
            pb.ToolCallDelta(index=0, arguments=arguments[half:]),
        ]
        for k, piece in enumerate(pieces):
            yield pb.GenerateResponse(
                request_id=rid,
                chunk=pb.Chunk(index=0, tool_calls=[piece], prompt_tokens=prompt_tokens, completion_tokens=k + 1),
            )
        call = pb.ToolCall(id="call_fake1", name=name, arguments=arguments)
        yield pb.GenerateResponse(
            request_id=rid,
            final=pb.Final(
                index=0,
                finish_reason=pb.FINISH_REASON_TOOL_CALLS,
                prompt_tokens=prompt_tokens,
                completion_tokens=2,
                tool_calls=[call],
            ),
        )


class FakeEngineServer(BackgroundServer):
    """The fake on the engine's own gRPC server, on a loopback port (0: a free one; `host`: another of
    this host's addresses) and a thread of this process; `address` and `port` are the bound ones once
    started."""

    def __init__(self, port: int = 0, model_id: str = MODEL_ID, host: str = "127.0.0.1") -> None:
        self.engine = FakeEngine(model_id)
        super().__init__(self.engine, host, port, description="the fake engine")

    def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING (as a draining replica reports), in effect on return."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.engine.serving = serving
        asyncio.run_coroutine_threadsafe(self._set_health(status), self._loop).result()

    async def _set_health(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        for name in ("", ENGINE_SERVICE):
            await self._health.set(name, status)

    def stop(self, grace: float = 0.0) -> None:
        """Calls still open (a shim's GenerateMany stream stays open) are cancelled, not waited for."""
        super().stop(grace)


def first_line(process: subprocess.Popen, timeout_s: float) -> str:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        process.kill()
        raise RuntimeError(f"{process.args} did not report its port") from None


def start_fake_engine_process(port: int = 0, timeout_s: float = 30.0) -> tuple[forked.ForkedProcess, str]:
    """This fake as a process of its own (so a test can SIGKILL or SIGSTOP it), forked from one that has
    imported it (forked.py); returns it and its address."""
    process = forked.start("fake_engine", ["--port", str(port)], dict(os.environ), REPO_ROOT)
    line = first_line(process, timeout_s)
    match = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"unexpected fake engine output: {line!r}")
    return process, match.group(1)


def start_shim(
    engine_address: str,
    *extra_args: str,
    timeout_s: float = 60.0,
    stderr: int | IO | None = None,
    env: dict[str, str] | None = None,
) -> tuple[forked.ForkedProcess, str]:
    """Starts a shim (`python -m http_shim`, forked from one that has imported it: forked.py)
    on a free loopback port; returns the process and its base URL. `stderr=subprocess.PIPE`
    captures its logs (read them after it exits); `env` adds variables."""
    argv = ["--engine", engine_address, "--host", "127.0.0.1", "--port", "0", *extra_args]
    process = forked.start("http_shim", argv, {**os.environ, **(env or {})}, REPO_ROOT, stderr)
    line = first_line(process, timeout_s)
    match = re.search(r"http://[\d.]+:(\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"unexpected shim output: {line!r}")
    return process, f"http://127.0.0.1:{match.group(1)}"


def stop_process(process: subprocess.Popen | forked.ForkedProcess) -> None:
    """SIGTERM, then its exit (a kill past 10 s). A shim waits up to a second for its idle keep-alive
    connections to close (http_shim/server.py), and an SDK client a test has dropped holds its own until
    the garbage collector breaks its reference cycles: a shim still up after a moment gets the young
    ones collected (~10 ms; a full collection took as long as the wait), not waited for."""
    process.terminate()
    try:
        process.wait(timeout=0.1)
        return
    except subprocess.TimeoutExpired:
        gc.collect(1)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main() -> None:
    """`python tests/fake_engine.py --port N`: serve the fake until SIGTERM (or the parent's death).
    `--listen-after S` waits S seconds before listening, as a real engine loads its model first."""
    from conduit_common.lifetime import die_with_parent

    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model-id", default=MODEL_ID)
    parser.add_argument("--listen-after", type=float, default=0.0, metavar="S")
    args = parser.parse_args()
    stopped = threading.Event()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):  # the launcher's stop sends SIGINT first
        signal.signal(stop_signal, lambda *_: stopped.set())
    if stopped.wait(args.listen_after):
        return
    server = FakeEngineServer(args.port, args.model_id).start()
    print(f"fake engine listening on {server.address}", flush=True)
    stopped.wait()
    server.stop()


if __name__ == "__main__":
    main()
