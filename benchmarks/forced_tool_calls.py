"""How forced tool calls end, over many seeds: the request from issue 7 (a JavaScript agent
framework's own tool schema), streamed and not, for tool_choice "required" and a named function.

    python -m benchmarks.forced_tool_calls [--base-url URL] [--seeds 40] [--max-tokens 80]

Without --base-url it starts its own stack. Prints, per mode, how many answers ended with
finish_reason "tool_calls" and how many complete calls failed to parse or carried markup.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import nullcontext
from typing import Any

import openai

from launcher.stack import Stack

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "weather", "description": "weather for a city",
    "parameters": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                   "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "weather"}}}
MARKUP = ("<tool_call>", "</tool_call>", "<|im_end|>")


def collect_stream(stream) -> tuple[str, list[dict[str, str]], str]:
    """Concatenate streamed tool-call fragments by index, as the openai SDK's helpers do."""
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def one_answer(client: openai.OpenAI, seed: int, choice: Any, stream: bool, max_tokens: int):
    request = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice, seed=seed,
                   max_tokens=max_tokens)
    if stream:
        return collect_stream(client.chat.completions.create(stream=True, **request))
    answer = client.chat.completions.create(**request).choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in answer.message.tool_calls or []]
    return answer.message.content or "", calls, answer.finish_reason


def bad_calls(content: str, calls: list[dict[str, str]], finish: str) -> int:
    """Complete calls (all but a last one cut by max_tokens) that do not parse, or any markup."""
    complete = calls[:-1] if finish == "length" else calls
    bad = sum(1 for call in calls if any(m in call["arguments"] for m in MARKUP))
    bad += any(m in content for m in MARKUP)
    for call in complete:
        try:
            if not isinstance(json.loads(call["arguments"]), dict):
                bad += 1
        except ValueError:
            bad += 1
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running shim's /v1 URL; default: start a stack")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    with (nullcontext() if args.base_url else Stack()) as stack:
        base_url = args.base_url or stack.base_url
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as client:
            for name, choice in CHOICES.items():
                for stream in (False, True):
                    finishes: Counter[str] = Counter()
                    calls_seen, bad = 0, 0
                    for seed in range(args.seeds):
                        content, calls, finish = one_answer(client, seed, choice, stream, args.max_tokens)
                        finishes[finish] += 1
                        calls_seen += len(calls)
                        bad += bad_calls(content, calls, finish)
                    print(f"{name:8} stream={stream!s:5} finish={dict(finishes)} calls={calls_seen} "
                          f"bad={bad}", flush=True)


if __name__ == "__main__":
    main()
