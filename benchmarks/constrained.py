"""Does constrained decoding slow its batch mates? `python -m benchmarks.constrained`

Runs the same batch twice over gRPC: 8 plain streams beside 8 more plain streams, then 8 plain
streams beside 8 streams constrained by a JSON schema. Same batch size both times, so the
difference in the plain streams' inter-token latency is the constraint's cost to others. The
schema asks for a long array so the constrained streams run as long as the plain ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc

from benchmarks.stats import percentile
from launcher.stack import Stack
from conduit.v1 import engine_pb2 as pb
from conduit.v1 import engine_pb2_grpc as pb_grpc

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}, "minItems": 16}},
          "required": ["name", "age", "hobbies"]}


def request(i: int, constrained: bool, max_tokens: int) -> pb.GenerateRequest:
    prompt = f"Describe person number {i} as JSON." if constrained else f"Tell me a story about place number {i}."
    req = pb.GenerateRequest(chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content=prompt)]),
                             sampling=pb.SamplingParams(temperature=0),
                             stopping=pb.StoppingParams(max_tokens=max_tokens, ignore_eos=not constrained))
    if constrained:
        req.constraint.json_schema = json.dumps(SCHEMA)
    return req


async def stream_gaps(stub: pb_grpc.EngineStub, req: pb.GenerateRequest) -> list[float]:
    gaps, last = [], None
    async for msg in stub.Generate(req):
        if msg.WhichOneof("kind") == "chunk":
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps


async def run_batch(address: str, constrained_neighbours: bool, width: int, max_tokens: int) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.EngineStub(channel)
        plain = [stream_gaps(stub, request(i, False, max_tokens)) for i in range(width)]
        others = [stream_gaps(stub, request(100 + i, constrained_neighbours, max_tokens)) for i in range(width)]
        results = await asyncio.gather(*plain, *others)
    plain_gaps = [g for gaps in results[:width] for g in gaps]
    return percentile(plain_gaps, 50) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=8, help="plain streams, and neighbours")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with Stack() as stack:
        asyncio.run(run_batch(stack.engine_address, True, args.width, 8))  # warm-up, grammar compiler
        for _ in range(args.rounds):
            base = asyncio.run(run_batch(stack.engine_address, False, args.width, args.max_tokens))
            mixed = asyncio.run(run_batch(stack.engine_address, True, args.width, args.max_tokens))
            print(f"plain streams' ITL p50: {base:.1f} ms beside plain, {mixed:.1f} ms beside JSON-schema "
                  f"streams ({(mixed / base - 1) * 100:+.0f}%)", flush=True)


if __name__ == "__main__":
    main()
