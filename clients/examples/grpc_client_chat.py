"""Call the Conduit engine directly over gRPC with the typed Python client.

    make run-stack                                   # in another terminal
    .venv/bin/python clients/examples/grpc_client_chat.py [--engine 127.0.0.1:50051]
"""

from __future__ import annotations

import argparse

from clients import ConduitError, EngineClient
from conduit.v1 import engine_pb2 as pb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="127.0.0.1:50051")
    parser.add_argument("--prompt", default="What is the capital of France?")
    args = parser.parse_args()
    messages = [{"role": "user", "content": args.prompt}]

    # Every call gets a 60 s deadline and this metadata unless it passes its own.
    with EngineClient(args.engine, timeout=60, metadata=[("x-caller", "grpc-example")]) as engine:
        print(f"health: {engine.health()}; models: {[m.id for m in engine.list_models()]}")

        result = engine.complete(messages=messages, temperature=0, max_tokens=64)
        print(f"complete(): {result.text!r} finish_reason={result.choices[0].finish_reason} usage={result.usage}")

        print("generate(): ", end="", flush=True)
        with engine.generate(messages=messages, temperature=0.7, seed=7, max_tokens=64) as stream:
            for response in stream:
                kind = response.WhichOneof("kind")
                if kind == "chunk":
                    print(response.chunk.text, end="", flush=True)
                elif kind == "final":
                    print(f"\n[{response.final.completion_tokens} tokens, "
                          f"finish_reason={pb.FinishReason.Name(response.final.finish_reason)}]")

        try:
            engine.complete(messages=messages, model="no-such-model")
        except ConduitError as error:  # NotFound, a ConduitError subclass
            print(f"errors are typed: {type(error).__name__}: {error.message}")


if __name__ == "__main__":
    main()
