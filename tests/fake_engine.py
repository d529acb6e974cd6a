"""A scripted Engine servicer on a real gRPC server, for tests of the HTTP shim alone.

The script is chosen by the input's last text (the last chat message, or the prompt):
  "echo-request"        the output text is the received GenerateRequest as JSON
  "error:CODE:message"  the call fails with grpc.StatusCode.CODE before any response
  "bad-field:PATH"      INVALID_ARGUMENT naming the GenerateRequest field PATH (trailing metadata)
  "midstream-error"     PromptInfo and one chunk, then INTERNAL
  "hang"                PromptInfo, then nothing until the caller cancels
  "slow:SECONDS"        PromptInfo, a pause, then the default answer
  "long:N"              N tokens, 20 ms apart (for disconnects mid-stream)
  "tools"               a streamed get_weather tool call, finish TOOL_CALLS
  "unicode"             multi-byte text
  "markdown"            MARKDOWN_ANSWER (Markdown, code blocks and HTML that must not run), in pieces
  anything else         "Hello from choice {i}." in five tokens, honouring max_tokens
It records every request, the call metadata each came with (by request id), and which ones were
cancelled, and its health status can be flipped. `start_shim` runs the real shim as a process
against any engine address; `start_fake_engine_process` runs this fake as a process of its own
(`python tests/fake_engine.py --port N`), for tests that kill the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from collections.abc import Iterator

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from conduit.common.lifetime import child_env
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc
from conduit.v1.contract import PARAM_METADATA_KEY, REQUEST_ID_METADATA_KEY
from engine_service.serving.many import CallEnded

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_ID = "fake-model"
MODEL_CREATED = 1_700_000_000
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
        self.cancelled: set[str] = set()
        self._changed = threading.Condition()

    # -------------------------------------------------------------- observation

    def wait_cancelled(self, request_id_prefix: str, timeout_s: float = 10.0) -> bool:
        """True once a request whose id starts with the prefix has been seen cancelled."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(r.startswith(request_id_prefix) for r in self.cancelled), timeout_s
            )

    def _record_cancel(self, request_id: str) -> None:
        with self._changed:
            self.cancelled.add(request_id)
            self._changed.notify_all()

    def _alive(self, context: grpc.ServicerContext, request_id: str) -> bool:
        if context.is_active():
            return True
        self._record_cancel(request_id)
        return False

    def _wait(self, context: grpc.ServicerContext, request_id: str, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self._alive(context, request_id):
                return False
            time.sleep(0.01)
        return True

    # -------------------------------------------------------------- RPCs

    def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[self._info()])

    def GetModelInfo(self, request, context):
        if request.model != self.model_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")
        return self._info()

    def _info(self) -> pb.ModelInfo:
        return pb.ModelInfo(id=self.model_id, source="fake", max_context_length=2048, vocab_size=1000, created=MODEL_CREATED)

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        with self._changed:
            self.requests.append(request)
            self.metadata[request.request_id] = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        # A cancelled call may never resume this generator (grpc drops it while sending), so the
        # termination callback is what reliably sees a cancellation.
        ended: list[bool] = []
        context.add_callback(lambda: ended or self._record_cancel(request.request_id))
        try:
            yield from self._generate(request, context)
        except Exception:  # an abort: ended, not cancelled
            ended.append(True)
            raise
        ended.append(True)

    def GenerateMany(self, requests: Iterator[pb.GenerateManyRequest],
                     context: grpc.ServicerContext) -> Iterator[pb.GenerateManyResponse]:
        """Each call runs this fake's Generate, on a thread of its own; what is ready goes out together."""
        ready: queue.Queue = queue.Queue()  # CallMessages, then _READ_DONE once the caller half-closed
        calls: dict[int, _CallContext] = {}

        def run(call_id: int, request: pb.GenerateRequest, call: _CallContext) -> None:
            end = pb.CallEnd()
            responses = self.Generate(request, call)
            try:
                for response in responses:
                    if not call.is_active():
                        break
                    ready.put(pb.CallMessage(call_id=call_id, response=response))
                if call.ended_by is not None:
                    end = pb.CallEnd(code=call.ended_by.value[0], message=call.ended_by.name)
            except CallEnded as aborted:
                end = pb.CallEnd(code=aborted.code.value[0], message=aborted.details,
                                 trailing_metadata=call.trailing_metadata)
            finally:
                responses.close()  # a cancelled call's generator ends here, as grpc ends it
                call.finish()
                ready.put(pb.CallMessage(call_id=call_id, end=end))

        def read() -> None:
            try:
                for request in requests:
                    if request.WhichOneof("action") == "start":
                        call = calls[request.call_id] = _CallContext(context, request.log_request_id,
                                                                     request.timeout_s)
                        threading.Thread(target=run, args=(request.call_id, request.start, call), daemon=True).start()
                    elif (call := calls.get(request.call_id)) is not None:
                        call.end(grpc.StatusCode.CANCELLED)
            except grpc.RpcError:
                pass  # the caller went away: its calls see the stream inactive and end
            ready.put(_READ_DONE)

        threading.Thread(target=read, daemon=True).start()
        reading, ended = True, 0
        while reading or ended < len(calls):  # `calls` is final once the reader is done
            items = [ready.get()]
            while not ready.empty():
                items.append(ready.get())
            batch = [item for item in items if item is not _READ_DONE]
            reading = reading and len(batch) == len(items)
            ended += sum(1 for message in batch if message.HasField("end"))
            if batch:
                yield pb.GenerateManyResponse(messages=batch)

    def _generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        rid = request.request_id
        script = _script_text(request)
        if request.model and request.model != self.model_id:  # as the real engine answers
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} is not served here")
        if script.startswith("error:"):
            _, code, message = script.split(":", 2)
            context.abort(grpc.StatusCode[code], message)
        if script.startswith("bad-field:"):
            path = script.split(":", 1)[1]
            context.set_trailing_metadata(((PARAM_METADATA_KEY, path),))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the engine refuses {path}")
        n = request.n if request.HasField("n") else 1
        prompt_tokens = len(script.split()) or 1
        yield pb.GenerateResponse(request_id=rid, prompt=self._prompt_info(request, script, prompt_tokens))
        if script == "hang":
            while self._alive(context, rid):
                time.sleep(0.01)
            return
        if script.startswith("slow:") and not self._wait(context, rid, float(script.split(":")[1])):
            return
        if script == "midstream-error":
            yield pb.GenerateResponse(
                request_id=rid,
                chunk=pb.Chunk(index=0, text="partial", prompt_tokens=prompt_tokens, completion_tokens=1),
            )
            context.abort(grpc.StatusCode.INTERNAL, "the fake engine broke mid-stream")
        if script == "tools":
            yield from self._tool_call(rid, prompt_tokens)
            return
        for i in range(n):
            tokens = self._tokens(request, script, i)
            limit = request.stopping.max_tokens if request.stopping.HasField("max_tokens") else len(tokens)
            emitted = tokens[:limit]
            for k, token in enumerate(emitted):
                if script.startswith("long:") and not self._wait(context, rid, 0.02):
                    return
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
        return ["Hello", " from", " choice", f" {choice}", "."]

    def _tool_call(self, rid: str, prompt_tokens: int) -> Iterator[pb.GenerateResponse]:
        pieces = [
            pb.ToolCallDelta(index=0, id="call_fake1", name="get_weather", arguments='{"city": '),
            pb.ToolCallDelta(index=0, arguments='"Paris"}'),
        ]
        for k, piece in enumerate(pieces):
            yield pb.GenerateResponse(
                request_id=rid,
                chunk=pb.Chunk(index=0, tool_calls=[piece], prompt_tokens=prompt_tokens, completion_tokens=k + 1),
            )
        call = pb.ToolCall(id="call_fake1", name="get_weather", arguments='{"city": "Paris"}')
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


_READ_DONE = object()


class _CallContext:
    """What FakeEngine.Generate uses of a grpc context, for one call of a GenerateMany stream."""

    def __init__(self, stream: grpc.ServicerContext, log_request_id: str, timeout_s: float) -> None:
        self._stream = stream
        own = ((REQUEST_ID_METADATA_KEY, log_request_id),) if log_request_id else ()
        self._metadata = own + tuple((k, v) for k, v in stream.invocation_metadata() if k != REQUEST_ID_METADATA_KEY)
        self._callbacks: list = []
        self.trailing_metadata: dict[str, str] = {}
        self.ended_by: grpc.StatusCode | None = None  # CANCELLED or DEADLINE_EXCEEDED, before its end
        self._timer = threading.Timer(timeout_s, self.end, (grpc.StatusCode.DEADLINE_EXCEEDED,)) if timeout_s else None
        if self._timer:
            self._timer.start()

    def end(self, code: grpc.StatusCode) -> None:
        if self.ended_by is None:
            self.ended_by = code

    def finish(self) -> None:
        if self._timer:
            self._timer.cancel()
        for callback in self._callbacks:
            callback()

    def invocation_metadata(self):
        return self._metadata

    def is_active(self) -> bool:
        return self.ended_by is None and self._stream.is_active()

    def add_callback(self, callback) -> None:
        self._callbacks.append(callback)

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing_metadata = dict(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise CallEnded(code, details)


class FakeEngineServer:
    """The fake on a real gRPC server on a loopback port (0: a free one), in this process's threads."""

    def __init__(self, port: int = 0, model_id: str = MODEL_ID) -> None:
        self.engine = FakeEngine(model_id)
        self.health = health.HealthServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        engine_pb2_grpc.add_EngineServicer_to_server(self.engine, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.address = f"127.0.0.1:{self.port}"
        self.set_serving(True)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", "conduit.v1.Engine"):
            self.health.set(name, status)

    def start(self) -> FakeEngineServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


def _first_line(process: subprocess.Popen, timeout_s: float) -> str:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        process.kill()
        raise RuntimeError(f"{process.args} did not report its port") from None


def start_fake_engine_process(port: int = 0, timeout_s: float = 30.0) -> tuple[subprocess.Popen, str]:
    """This fake as a process of its own (so a test can SIGKILL it); returns it and its address."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    line = _first_line(process, timeout_s)
    match = re.search(r"listening on (127\.0\.0\.1:\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"unexpected fake engine output: {line!r}")
    return process, match.group(1)


def start_shim(
    engine_address: str,
    *extra_args: str,
    timeout_s: float = 60.0,
    stderr: int | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Starts `python -m http_shim` on a free loopback port; returns the process and its base URL.
    `stderr=subprocess.PIPE` captures its logs (read them after it exits); `env` adds variables."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http_shim",
            "--engine",
            engine_address,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *extra_args,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=child_env({**os.environ, **(env or {})}),  # the shim dies with this process, even a SIGKILLed test run
    )
    line = _first_line(process, timeout_s)
    match = re.search(r"http://[\d.]+:(\d+)", line)
    if not match:
        process.kill()
        raise RuntimeError(f"unexpected shim output: {line!r}")
    return process, f"http://127.0.0.1:{match.group(1)}"


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _main() -> None:
    """`python tests/fake_engine.py --port N`: serve the fake until SIGTERM (or the parent's death)."""
    from conduit.common.lifetime import die_with_parent

    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    server = FakeEngineServer(parser.parse_args().port).start()
    print(f"fake engine listening on {server.address}", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop()


if __name__ == "__main__":
    _main()
