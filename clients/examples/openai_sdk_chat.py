"""Chat with Conduit through the official openai SDK, non-streaming and streaming.

    make run-stack                                   # in another terminal
    .venv/bin/python clients/examples/openai_sdk_chat.py [--base-url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse

import openai


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--prompt", default="What is the capital of France?")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": args.prompt}]

    response = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=64)
    print(f"[{model}] {response.choices[0].message.content}")
    print(f"finish_reason={response.choices[0].finish_reason} usage={response.usage.model_dump()}")

    print("streaming: ", end="", flush=True)
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=64,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        for choice in chunk.choices:
            print(choice.delta.content or "", end="", flush=True)
        if chunk.usage:
            print(f"\nusage={chunk.usage.model_dump()}")


if __name__ == "__main__":
    main()
