"""The serving engine over its real gRPC API on the real default model: with --deterministic,
batching must not change results; n, logprobs, stop strings, cancellation and the queue limit work."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import STARTUP_TIMEOUT_S

from launcher.stack import Stack
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc
from engine_service.core.faults import HOLD_MARKER, TOKENIZE_HOLD_ENV

pytestmark = pytest.mark.model

PROMPTS = [
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write one sentence about dogs.",
    "Count from 1 to 10.",
    "What is 12 plus 7?",
    "Give me a short greeting in Spanish.",
    "Describe the sun in five words.",
    "What do bees make?",
]


@pytest.fixture(scope="module")
def stub(stack: Stack) -> Iterator[pb_grpc.EngineStub]:
    with grpc.insecure_channel(stack.engine_address) as channel:
        yield pb_grpc.EngineStub(channel)


@pytest.fixture(scope="module")
def deterministic_stub() -> Iterator[pb_grpc.EngineStub]:
    """By default a step of more than 8 rows runs bf16 copies of the int8 weights (faster there), so a
    request's tokens may change with its batch; --deterministic keeps them (model/linear.py)."""
    with Stack(engine_args=["--deterministic"], startup_timeout=STARTUP_TIMEOUT_S) as stack, \
            grpc.insecure_channel(stack.engine_address) as channel:
        yield pb_grpc.EngineStub(channel)


def chat(prompt: str, max_tokens: int = 32, temperature: float = 0.0, **kw) -> pb.GenerateRequest:
    sampling = kw.pop("sampling", pb.SamplingParams(temperature=temperature))
    stopping = kw.pop("stopping", pb.StoppingParams(max_tokens=max_tokens))
    return pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=prompt)]),
                              sampling=sampling, stopping=stopping, **kw)


def collect(stub: pb_grpc.EngineStub, request: pb.GenerateRequest) -> dict:
    """Run one Generate; return per-choice text, token ids, logprobs and finals."""
    out = {"text": {}, "ids": {}, "logprobs": {}, "final": {}, "prompt": None}
    for msg in stub.Generate(request, timeout=300):
        kind = msg.WhichOneof("kind")
        if kind == "prompt":
            out["prompt"] = msg.prompt
        elif kind == "chunk":
            c = msg.chunk
            out["text"][c.index] = out["text"].get(c.index, "") + c.text
            out["ids"].setdefault(c.index, []).extend(c.token_ids)
            out["logprobs"].setdefault(c.index, []).extend(c.logprobs)
        else:
            out["final"][msg.final.index] = msg.final
    return out


def run_concurrently(stub, requests: list[pb.GenerateRequest]) -> list[dict]:
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: collect(stub, r), requests))


def tokens_and_logprobs(result: dict) -> list[tuple[int, float]]:
    return [(entry.token_id, entry.logprob) for entry in result["logprobs"][0]]


@pytest.mark.parametrize("batch", [12])
def test_greedy_tokens_and_logprobs_are_the_same_alone_and_in_a_batch(deterministic_stub, batch: int):
    stub = deterministic_stub
    probes = [chat(p, max_tokens=32, logprobs=True) for p in PROMPTS[:6]]
    alone = [tokens_and_logprobs(collect(stub, r)) for r in probes]
    fillers = [chat(PROMPTS[i % len(PROMPTS)] + f" (variant {i})", max_tokens=32) for i in range(batch - 6)]
    batched = run_concurrently(stub, probes + fillers)
    assert [tokens_and_logprobs(b) for b in batched[:6]] == alone


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(deterministic_stub):
    stub = deterministic_stub
    seeded = chat(PROMPTS[2], max_tokens=30, sampling=pb.SamplingParams(temperature=1.0, top_p=0.95, seed=1234))
    alone = collect(stub, seeded)["ids"][0]
    others = [chat(p, max_tokens=30, sampling=pb.SamplingParams(temperature=1.0)) for p in PROMPTS]
    batched = run_concurrently(stub, [seeded] + others)
    assert batched[0]["ids"][0] == alone
    different_seed = chat(PROMPTS[2], max_tokens=30, sampling=pb.SamplingParams(temperature=1.0, top_p=0.95, seed=99))
    assert collect(stub, different_seed)["ids"][0] != alone


def test_n_choices_share_one_prompt_and_are_multiplexed_by_index(stub):
    result = collect(stub, chat("Tell me a fun fact.", max_tokens=24, n=4,
                                sampling=pb.SamplingParams(temperature=1.0, seed=7)))
    assert sorted(result["final"]) == [0, 1, 2, 3]
    assert result["prompt"].prompt_tokens == result["final"][0].prompt_tokens
    for i in range(4):
        assert result["final"][i].completion_tokens == len(result["ids"][i])
    assert len({tuple(ids) for ids in result["ids"].values()}) > 1


def test_greedy_n_choices_are_identical(stub):
    result = collect(stub, chat(PROMPTS[0], max_tokens=16, n=3))
    assert result["ids"][0] == result["ids"][1] == result["ids"][2]


def test_logprobs_report_the_chosen_token_and_sorted_alternatives(stub):
    result = collect(stub, chat(PROMPTS[0], max_tokens=8, logprobs=True, top_logprobs=5))
    entries = result["logprobs"][0]
    assert [e.token_id for e in entries] == result["ids"][0]
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert entry.token_id == entry.top_logprobs[0].token_id  # greedy picks the most likely
        assert math.isclose(entry.logprob, values[0], abs_tol=1e-5)
        assert entry.logprob <= 0


def test_echo_with_logprobs_scores_the_prompt(stub):
    request = pb.GenerateRequest(text="The quick brown fox jumps over the lazy dog", echo=True, logprobs=True,
                                 top_logprobs=1, sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingParams(max_tokens=1))
    prompt = collect(stub, request)["prompt"]
    assert len(prompt.prompt_logprobs) == prompt.prompt_tokens == len(prompt.prompt_token_ids)
    assert math.isnan(prompt.prompt_logprobs[0].logprob)
    assert all(lp.logprob <= 0 for lp in prompt.prompt_logprobs[1:])


def test_stop_string_across_token_boundaries(stub):
    free = collect(stub, chat("Count from 1 to 10, separated by commas.", max_tokens=40))
    ids, text = free["ids"][0], free["text"][0]
    assert len(ids) > 6
    # A stop string made of the end of one token and the start of the next.
    stop = text[4:9]
    stopped = collect(stub, chat("Count from 1 to 10, separated by commas.", max_tokens=40,
                                 stopping=pb.StoppingParams(max_tokens=40, stop=[stop])))
    assert stopped["text"][0] == text[:text.index(stop)]
    assert stopped["final"][0].finish_reason == pb.FINISH_REASON_STOP
    assert stopped["final"][0].matched_stop == stop


def test_max_tokens_ignore_eos_and_min_tokens(stub):
    result = collect(stub, chat(PROMPTS[0], stopping=pb.StoppingParams(max_tokens=50, ignore_eos=True)))
    assert result["final"][0].finish_reason == pb.FINISH_REASON_LENGTH
    assert result["final"][0].completion_tokens == 50
    result = collect(stub, chat(PROMPTS[0], stopping=pb.StoppingParams(max_tokens=30, min_tokens=20)))
    assert result["final"][0].completion_tokens >= 20


def test_stop_token_ids_end_generation(stub):
    free = collect(stub, chat(PROMPTS[3], max_tokens=20))
    stop_id = free["ids"][0][3]
    result = collect(stub, chat(PROMPTS[3], stopping=pb.StoppingParams(max_tokens=20, stop_token_ids=[stop_id])))
    first = free["ids"][0].index(stop_id)
    assert result["ids"][0] == free["ids"][0][:first + 1]
    assert result["final"][0].finish_reason == pb.FINISH_REASON_STOP


def test_bad_parameters_are_invalid_argument(stub):
    for request in (chat("hi", sampling=pb.SamplingParams(temperature=5)),
                    chat("hi", n=0), chat("hi", logprobs=True, top_logprobs=30),
                    pb.GenerateRequest(token_ids=pb.TokenIds(ids=[10 ** 7])),
                    pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="wizard", content="x")])),
                    pb.GenerateRequest()):
        with pytest.raises(grpc.RpcError) as err:
            collect(stub, request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request


def long_running(stub: pb_grpc.EngineStub):
    return stub.Generate(chat("Write a very long story about a dragon.",
                              stopping=pb.StoppingParams(max_tokens=4000, ignore_eos=True)))


def test_cancelling_a_call_frees_its_slot(single_slot_stack: Stack):
    """With one slot, a later request can only finish if the cancelled one let go of it."""
    with grpc.insecure_channel(single_slot_stack.engine_address) as channel:
        stub = pb_grpc.EngineStub(channel)
        call = long_running(stub)
        chunks = 0
        for msg in call:
            chunks += msg.WhichOneof("kind") == "chunk"
            if chunks == 3:
                break
        call.cancel()
        result = collect(stub, chat(PROMPTS[4], max_tokens=8))
        assert result["final"][0].completion_tokens > 0


def drain_until_cancelled(call) -> None:
    try:
        for _ in call:
            pass
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.CANCELLED


def test_queue_full_is_resource_exhausted(single_slot_stack: Stack):
    with grpc.insecure_channel(single_slot_stack.engine_address) as channel:
        stub = pb_grpc.EngineStub(channel)
        running = long_running(stub)
        next(iter(running))  # admitted: holds the only slot
        waiting = [long_running(stub) for _ in range(2)]  # fill the two-place queue
        for call in waiting:
            threading.Thread(target=drain_until_cancelled, args=(call,), daemon=True).start()
        # Queued before the probes: requests are tokenized side by side, so a later short one may
        # otherwise be queued first (the engine's load report is as of its last step).
        deadline = time.monotonic() + 60
        while stub.GetLoad(pb.GetLoadRequest()).waiting_requests < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        codes = []
        while time.monotonic() < deadline and grpc.StatusCode.RESOURCE_EXHAUSTED not in codes:
            try:
                collect(stub, chat("hi", max_tokens=1))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())
            time.sleep(0.2)
        for call in [running, *waiting]:
            call.cancel()
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


def test_a_long_prompt_does_not_stall_running_streams(stub):
    """Prefill is chunked: a running stream keeps getting tokens while a long prompt is prefilled."""
    runner = stub.Generate(chat("Tell me a long story.", stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True)))
    stream = iter(runner)
    next(stream)  # PromptInfo: the stream is running
    long_prompt = pb.GenerateRequest(text="word " * 2200, stopping=pb.StoppingParams(max_tokens=1))
    first_token = threading.Event()

    def send_long() -> None:
        for msg in stub.Generate(long_prompt):
            if msg.WhichOneof("kind") == "chunk":
                first_token.set()

    sender = threading.Thread(target=send_long)
    sender.start()
    during = 0
    for msg in stream:
        if first_token.is_set():
            break
        during += msg.WhichOneof("kind") == "chunk"
    runner.cancel()
    sender.join()
    # 2200 words take at least four steps of the default 512-token budget; the stream advances on each
    # (unchunked, the prompt would be one step).
    assert during >= 3


@pytest.mark.parametrize("call", ["Generate", "Tokenize"])
def test_a_long_prompt_in_tokenization_does_not_stall_running_streams(stub, stack: Stack, call: str):
    """Chat templates and tokenization run off the gRPC loop that delivers every stream's tokens
    (a 100k-character prompt takes ~0.1-1 s there: benchmarks/RESULTS.md). The engine's fault hook
    holds the marked request's tokenization until released: a running stream keeps getting tokens
    meanwhile (on the loop, the hold blocked it whole)."""
    gate = Path(stack.engine_env[TOKENIZE_HOLD_ENV])
    held, release = gate / "held", gate / "release"
    runner = stub.Generate(chat("Tell me a long story.", stopping=pb.StoppingParams(max_tokens=400, ignore_eos=True)))
    stream = iter(runner)
    next(stream)  # PromptInfo: the stream is running
    # Short: the hold stands for a long tokenization (the hook holds it, whatever its length), and a long
    # prompt's prefill afterwards would only cost time.
    messages = [pb.ChatMessage(role="user", content=f"{HOLD_MARKER} and a few words")]
    if call == "Generate":
        sender = threading.Thread(target=lambda: collect(stub, pb.GenerateRequest(
            chat=pb.ChatInput(messages=messages), stopping=pb.StoppingParams(max_tokens=1))))
    else:
        sender = threading.Thread(target=lambda: stub.Tokenize(pb.TokenizeRequest(chat=pb.ChatInput(messages=messages)),
                                                               timeout=300))
    sender.start()
    deadline = time.monotonic() + 60
    while not held.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.exists(), "the marked request never reached tokenization"
    # Held on the loop, nothing would come until this timer released it (then `held` is gone).
    unblock = threading.Timer(30, release.touch)
    unblock.start()
    during = 0
    for msg in stream:
        if not held.exists() or during >= 5:
            break
        during += msg.WhichOneof("kind") == "chunk"
    release.touch()
    unblock.cancel()
    runner.cancel()
    sender.join()
    # A chunk or two may have been on the wire when the hold began; five more came during it.
    assert during >= 5


def test_dropping_the_oldest_messages_needs_chat_input(stub):
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, pb.GenerateRequest(text="hi", drop_oldest_messages=True, stopping=pb.StoppingParams(max_tokens=1)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "chat input" in err.value.details()
    trailing = dict(err.value.trailing_metadata())
    assert trailing.get("conduit-param") == "drop_oldest_messages"


def test_echo_with_zero_max_tokens_only_scores_the_prompt(stub):
    request = pb.GenerateRequest(text="Paris is the capital of France", echo=True, logprobs=True,
                                 stopping=pb.StoppingParams(max_tokens=0))
    result = collect(stub, request)
    assert result["final"][0].completion_tokens == 0
    assert result["final"][0].finish_reason == pb.FINISH_REASON_LENGTH
    assert result["prompt"].prompt_text == "Paris is the capital of France"
    assert len(result["prompt"].prompt_logprobs) == result["prompt"].prompt_tokens
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, pb.GenerateRequest(text="hi", stopping=pb.StoppingParams(max_tokens=0)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_forced_tool_call_streams_header_then_argument_fragments(stub):
    import json

    tool = pb.Tool(name="get_weather", description="Current weather for a city", parameters_json=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
    request = pb.GenerateRequest(
        chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content="What is the weather in Paris?")],
                          tools=[tool], tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION,
                                                                  function_name="get_weather"),
                          parallel_tool_calls=False),
        sampling=pb.SamplingParams(temperature=0), stopping=pb.StoppingParams(max_tokens=60))
    deltas, final = [], None
    for msg in stub.Generate(request):
        if msg.WhichOneof("kind") == "chunk":
            deltas.extend(msg.chunk.tool_calls)
        elif msg.WhichOneof("kind") == "final":
            final = msg.final
    assert final.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    assert deltas[0].id and deltas[0].name == "get_weather" and deltas[0].arguments == ""
    fragments = [d.arguments for d in deltas[1:]]
    assert len(fragments) > 1 and all(not d.id for d in deltas[1:])
    assert json.loads("".join(fragments)) == json.loads(final.tool_calls[0].arguments)
    assert final.tool_calls[0].id == deltas[0].id
