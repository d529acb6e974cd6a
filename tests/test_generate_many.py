"""GenerateMany (engine_service/serving/many.py) and the client's shared calls over it
(clients/many_calls.py), on the engine's real gRPC server around a scripted asyncio servicer, so
they run in the fast tier; and on the real engine (model tier), where a step's messages for the
calls of a stream travel as one response. Every stack test (the real engine behind the real shim)
relays over it too.

The servicer's Generate is scripted by the prompt text:
  "count:N"  PromptInfo, N one-token chunks, Final
  "bad"      INVALID_ARGUMENT naming the field `sampling.top_p` in trailing metadata
  "hang"     PromptInfo, then nothing until cancelled (recorded)
  "gate:MS"  PromptInfo, then MS ms after `open_gate()` is called one chunk, then Final
  "lost"     PromptInfo, then UNAVAILABLE (an engine that went away mid-call)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from clients import Cancelled, DeadlineExceeded, EngineClient, InvalidArgument, Unavailable, build_request
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc
from engine_service.serving.background import BackgroundServer
from engine_service.serving.many import ManyCalls


class ScriptedEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self) -> None:
        self.streams = 0  # GenerateMany streams opened
        self.generate_calls = 0
        self.cancelled: list[str] = []
        self.refuse_first = 0  # refuse this many calls with UNAVAILABLE (as a draining engine does)
        self.draining = False
        self.gate = asyncio.Event()  # binds to the server's loop when first awaited
        self.loop: asyncio.AbstractEventLoop | None = None

    def saw_cancelled(self, request_id: str, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while request_id not in self.cancelled:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def open_gate(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)

    async def Generate(self, request: pb.GenerateRequest, context):
        self.generate_calls += 1
        self.loop = asyncio.get_running_loop()
        if self.refuse_first > 0:
            self.refuse_first -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        script, rid = request.text, request.request_id
        if script == "bad":
            context.set_trailing_metadata((("conduit-param", "sampling.top_p"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1]")
        yield pb.GenerateResponse(request_id=rid, prompt=pb.PromptInfo(prompt_tokens=1))
        if script == "hang":
            try:
                await asyncio.Event().wait()
            finally:
                self.cancelled.append(rid)
        if script == "lost":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine went away")
        if script.startswith("gate:"):
            await self.gate.wait()
            await asyncio.sleep(int(script.split(":")[1]) / 1000)
        count = int(script.split(":")[1]) if script.startswith("count:") else 1
        for i in range(count):
            yield pb.GenerateResponse(request_id=rid, chunk=pb.Chunk(index=0, text=f"t{i}", token_ids=[i]))
            await asyncio.sleep(0)
        yield pb.GenerateResponse(request_id=rid, final=pb.Final(index=0, finish_reason=pb.FINISH_REASON_LENGTH))

    async def GenerateMany(self, requests, context):
        self.streams += 1
        self.loop = asyncio.get_running_loop()
        calls = ManyCalls(self.Generate, context, lambda: self.draining)
        async for response in calls.responses(requests):
            yield response


class OlderEngine(ScriptedEngine):
    """An engine from before GenerateMany: the generated base class answers UNIMPLEMENTED."""

    GenerateMany = engine_pb2_grpc.EngineServicer.GenerateMany


@pytest.fixture
def served() -> Iterator[tuple[ScriptedEngine, EngineClient]]:
    engine = ScriptedEngine()
    server = BackgroundServer(engine, "127.0.0.1", 0).start()
    client = EngineClient(server.address)
    yield engine, client
    client.close()
    server.stop(grace=0)


def kinds(responses: list[pb.GenerateResponse]) -> list[str]:
    return [r.WhichOneof("kind") for r in responses]


def test_calls_share_one_stream_and_each_gets_its_own_messages(served) -> None:
    engine, client = served
    results: dict[str, list[pb.GenerateResponse]] = {}

    def run(rid: str, count: int) -> None:
        results[rid] = list(client.generate_shared(build_request(prompt=f"count:{count}", request_id=rid)))

    threads = [threading.Thread(target=run, args=(f"r{n}", n)) for n in (3, 5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    for n in (3, 5, 7):
        got = results[f"r{n}"]
        assert kinds(got) == ["prompt"] + ["chunk"] * n + ["final"]
        assert {r.request_id for r in got} == {f"r{n}"}
        assert [r.chunk.text for r in got[1:-1]] == [f"t{i}" for i in range(n)]
    assert engine.streams == 1 and engine.generate_calls == 3


def test_a_failed_call_keeps_its_status_and_trailing_metadata(served) -> None:
    _, client = served
    with pytest.raises(InvalidArgument) as raised:
        list(client.generate_shared(build_request(prompt="bad")))
    assert raised.value.param == "sampling.top_p" and "top_p" in raised.value.message
    # The stream carries on for the next call.
    assert kinds(list(client.generate_shared(build_request(prompt="count:1")))) == ["prompt", "chunk", "final"]


def test_close_cancels_the_call_in_the_engine(served) -> None:
    engine, client = served
    call = client.generate_shared(build_request(prompt="hang", request_id="h1"))
    assert next(call).WhichOneof("kind") == "prompt"
    waiting: list[BaseException] = []

    def wait() -> None:
        try:
            next(call)
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            waiting.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    call.close()
    waiter.join(timeout=5)
    assert waiting and isinstance(waiting[0], Cancelled)
    assert engine.saw_cancelled("h1"), "the engine never saw the cancellation"


def test_the_deadline_ends_the_call_in_the_engine_and_here(served) -> None:
    engine, client = served
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        list(client.generate_shared(build_request(prompt="hang", request_id="d1"), timeout=0.3))
    assert time.monotonic() - started < 2.0
    assert engine.saw_cancelled("d1"), "the engine kept generating past the deadline"


def test_a_refused_call_is_sent_again_as_grpc_would_retry_it(served) -> None:
    engine, client = served
    engine.refuse_first = 2  # the policy's 3 attempts: two refusals, then an answer
    assert kinds(list(client.generate_shared(build_request(prompt="count:1")))) == ["prompt", "chunk", "final"]
    assert engine.generate_calls == 3
    engine.refuse_first = 3
    with pytest.raises(Unavailable):
        list(client.generate_shared(build_request(prompt="count:1")))
    assert engine.generate_calls == 6


def test_a_call_that_already_answered_is_not_sent_again(served) -> None:
    engine, client = served
    call = client.generate_shared(build_request(prompt="lost"))
    assert next(call).WhichOneof("kind") == "prompt"
    with pytest.raises(Unavailable):
        next(call)
    assert engine.generate_calls == 1  # its text so far was relayed: a retry would repeat it


def test_a_closed_call_is_not_sent_again(served) -> None:
    engine, client = served
    engine.refuse_first = 1
    refused = client.generate_shared(build_request(prompt="count:1"))
    deadline = time.monotonic() + 5
    while engine.generate_calls < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # This call's messages follow the refusal on the stream: once it is done, the refusal is here.
    list(client.generate_shared(build_request(prompt="count:1")))
    refused.close()
    with pytest.raises(Unavailable):  # the refusal, not taken as a reason to send it again
        list(refused)
    # A resent call would have reached the engine before this one (one stream, in order).
    list(client.generate_shared(build_request(prompt="count:1")))
    assert engine.generate_calls == 3


def test_an_engine_without_generate_many_gets_plain_generate_calls() -> None:
    engine = OlderEngine()
    server = BackgroundServer(engine, "127.0.0.1", 0).start()
    try:
        with EngineClient(server.address) as client:
            for _ in range(2):
                got = list(client.generate_shared(build_request(prompt="count:2")))
                assert kinds(got) == ["prompt", "chunk", "chunk", "final"]
        assert engine.generate_calls == 2 and engine.streams == 0
    finally:
        server.stop(grace=0)


def start(call_id: int, prompt: str) -> pb.GenerateManyRequest:
    return pb.GenerateManyRequest(call_id=call_id, start=build_request(prompt=prompt, request_id=f"c{call_id}"))


def test_messages_that_are_ready_together_travel_in_one_response(served) -> None:
    """Both calls wake on one event (as a step's outputs reach every call at once): their chunks
    travel in one response, with no timer to wait on."""
    engine, client = served
    stub = engine_pb2_grpc.EngineStub(client._channel)
    outbox: list[pb.GenerateManyRequest] = [start(1, "gate:0"), start(2, "gate:0")]
    stream = stub.GenerateMany(iter(outbox), timeout=10)
    seen: list[list[tuple[int, str]]] = []
    for response in stream:
        batch = [(m.call_id, m.response.WhichOneof("kind") if m.HasField("response") else "end")
                 for m in response.messages]
        seen.append(batch)
        if sum(kind == "prompt" for b in seen for _, kind in b) == 2 and not engine.gate.is_set():
            engine.open_gate()
    chunks = [sorted(call for call, kind in batch if kind == "chunk") for batch in seen]
    assert [1, 2] in chunks, seen  # both calls' chunks in one message
    assert sum(kind == "end" for batch in seen for _, kind in batch) == 2  # then the stream ended: half-closed


def test_a_call_id_already_open_is_refused_and_the_first_goes_on(served) -> None:
    engine, client = served
    stub = engine_pb2_grpc.EngineStub(client._channel)
    codes = []
    for response in stub.GenerateMany(iter([start(1, "gate:0"), start(1, "count:1")]), timeout=10):
        codes += [m.end.code for m in response.messages if m.HasField("end")]
        if codes == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]:
            engine.open_gate()  # the first call, held open until the second was refused, ends now
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.OK.value[0]]


def test_a_request_that_neither_starts_nor_cancels_is_refused(served) -> None:
    _, client = served
    stub = engine_pb2_grpc.EngineStub(client._channel)
    responses = list(stub.GenerateMany(iter([pb.GenerateManyRequest(call_id=9)]), timeout=10))
    ends = [m for r in responses for m in r.messages]
    assert [(m.call_id, m.end.code) for m in ends] == [(9, grpc.StatusCode.INVALID_ARGUMENT.value[0])]
    assert "start" in ends[0].end.message


def test_a_draining_engine_ends_its_idle_streams(served) -> None:
    engine, client = served
    stub = engine_pb2_grpc.EngineStub(client._channel)
    never = threading.Event()
    stream = stub.GenerateMany(iter(never.wait, True), timeout=10)  # a caller that never half-closes
    time.sleep(0.2)
    engine.draining = True
    started = time.monotonic()
    assert list(stream) == []
    assert time.monotonic() - started < 3.0


@pytest.mark.model
def test_on_the_real_engine_each_step_is_one_response_to_a_stream(stack) -> None:
    """Calls started together decode in lockstep: every response that carries chunks carries one
    for each call (a step's messages, never split, never held back by a timer)."""
    calls, tokens = 4, 12
    request = dict(prompt="Once upon a time", max_tokens=tokens, ignore_eos=True, temperature=0)
    outbox = [pb.GenerateManyRequest(call_id=k, start=build_request(**request, request_id=f"s{k}"))
              for k in range(calls)]
    with grpc.insecure_channel(stack.engine_address) as channel:
        responses = list(engine_pb2_grpc.EngineStub(channel).GenerateMany(iter(outbox), timeout=120))
    chunked = [sorted(m.call_id for m in r.messages if m.HasField("response") and m.response.HasField("chunk"))
               for r in responses]
    chunked = [set(ids) for ids in chunked if ids]
    assert sum(len(r.messages) for r in responses) >= calls * tokens  # every token its own chunk (auto interval)
    # A response may hold several steps (a writer behind the engine), never part of one. The calls
    # may join over the first steps, so up to two responses may hold some of them.
    partial = [ids for ids in chunked if ids != set(range(calls))]
    assert len(partial) <= 2, chunked


def test_a_call_cancelled_before_it_ran_still_ends_and_the_stream_closes() -> None:
    """Start and cancel read back to back: the call's task is cancelled before its first step (its
    body never runs), yet the call gets its CANCELLED end and the stream ends once half-closed."""

    class StreamContext:
        def invocation_metadata(self):
            return ()

    async def never_called(request, context):
        raise AssertionError("the call never starts")
        yield  # an async generator, as Generate is

    async def requests():
        yield start(1, "count:1")
        yield pb.GenerateManyRequest(call_id=1, cancel=True)

    async def run() -> list[pb.GenerateManyResponse]:
        calls = ManyCalls(never_called, StreamContext(), lambda: False)
        return [response async for response in calls.responses(requests())]

    responses = asyncio.run(asyncio.wait_for(run(), 5))
    ends = [m.end for r in responses for m in r.messages if m.HasField("end")]
    assert [(end.code, end.message) for end in ends] == [(grpc.StatusCode.CANCELLED.value[0], "the caller cancelled the call")]
