"""How long a long prompt's tokenization stalls the other streams: the largest gap between the
chunks of a running stream while a 100k-character chat arrives beside it, against its gaps alone.

    python -m benchmarks.loop_stall                         # starts its own engine
    python -m benchmarks.loop_stall --address 127.0.0.1:50051 --rounds 5

One stream generates (ignore_eos) throughout. Each round waits --quiet-s, sends a chat Generate
of --chars characters (longer than the context: the engine renders and tokenizes it, then refuses
it) and takes the largest gap between the stream's chunks while it is answered, and in a window
as long just before (baseline). The tokenization time is a Tokenize call of
the same chat with nothing else running. Where the template and tokenizer ran on the gRPC loop,
the gap during grew by about that time; off the loop, it stays near the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time

import grpc

from launcher.stack import Stack
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc

STREAM_TOKENS = 4000  # longer than a run
STORY = pb.ChatInput(messages=[pb.ChatMessage(role="user", content="Tell me a very long story.")])


def long_chat(chars: int) -> pb.ChatInput:
    words = "the quick brown fox jumps over the lazy dog " * (chars // 44 + 1)
    return pb.ChatInput(messages=[pb.ChatMessage(role="user", content=words[:chars])])


class Stream:
    """A running stream; `arrivals` the monotonic time of each chunk."""

    def __init__(self, stub: pb_grpc.EngineStub) -> None:
        self.arrivals: list[float] = []
        self.call = stub.Generate(pb.GenerateRequest(chat=STORY, stopping=pb.StoppingParams(
            max_tokens=STREAM_TOKENS, ignore_eos=True)))
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                if message.WhichOneof("kind") == "chunk":
                    self.arrivals.append(time.monotonic())
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise

    def max_gap(self, start: float, end: float, open_end: bool = True) -> float:
        """The largest gap between chunks that overlaps [start, end] (`open_end` False: that ends by `end`)."""
        before = [t for t in self.arrivals if t < start][-1:]
        after = [t for t in self.arrivals if t > end][:1] if open_end else []
        times = before + [t for t in self.arrivals if start <= t <= end] + after
        return max(b - a for a, b in zip(times, times[1:]))

    def median_gap(self) -> float:
        return statistics.median(b - a for a, b in zip(self.arrivals, self.arrivals[1:]))


def run(stub: pb_grpc.EngineStub, chars: int, rounds: int, quiet_s: float) -> dict:
    chat = long_chat(chars)
    started = time.perf_counter()
    tokens = len(stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=120).token_ids)
    tokenize_s = time.perf_counter() - started
    tokenize_s = min(tokenize_s, *(timed_tokenize(stub, chat) for _ in range(2)))
    stream = Stream(stub)
    while len(stream.arrivals) < 5:
        assert stream.thread.is_alive(), "the running stream failed"
        time.sleep(0.05)
    baseline, during, answered = [], [], []
    for _ in range(rounds):
        time.sleep(quiet_s)
        sent = time.monotonic()
        try:
            stub.Generate(pb.GenerateRequest(chat=chat, stopping=pb.StoppingParams(max_tokens=1)), timeout=120)\
                .next()
        except grpc.RpcError as err:  # longer than the context: refused once tokenized
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        done = time.monotonic()
        answered.append(done - sent)
        time.sleep(0.5)  # the chunk after `done` has come
        during.append(stream.max_gap(sent, done))
        baseline.append(stream.max_gap(sent - (done - sent), sent, open_end=False))  # as long, just before
    stream.call.cancel()
    return {"chars": chars, "tokens": tokens, "tokenize_s": tokenize_s, "answered_s": statistics.median(answered),
            "median_gap_s": stream.median_gap(),
            "baseline_gap_s": statistics.median(baseline), "during_gap_s": statistics.median(during),
            "during_gap_max_s": max(during)}


def timed_tokenize(stub: pb_grpc.EngineStub, chat: pb.ChatInput) -> float:
    started = time.perf_counter()
    stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=120)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", help="a running engine (default: start one)")
    parser.add_argument("--chars", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quiet-s", type=float, default=2.0)
    args = parser.parse_args()
    with contextlib.ExitStack() as scope:
        address = args.address or scope.enter_context(Stack(startup_timeout=300)).engine_address
        channel = scope.enter_context(grpc.insecure_channel(address))
        result = run(pb_grpc.EngineStub(channel), args.chars, args.rounds, args.quiet_s)
    print(f"{result['chars']:,} characters ({result['tokens']:,} tokens): Tokenize alone "
          f"{result['tokenize_s'] * 1000:.0f} ms; refused in {result['answered_s'] * 1000:.0f} ms (median)")
    print(f"a running stream's chunks: median gap {result['median_gap_s'] * 1000:.0f} ms; largest gap "
          f"{result['baseline_gap_s'] * 1000:.0f} ms just before, "
          f"{result['during_gap_s'] * 1000:.0f} ms while it is tokenized (median of {args.rounds} rounds; "
          f"worst {result['during_gap_max_s'] * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
