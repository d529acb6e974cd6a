"""Engine responses -> OpenAI objects: whole responses and streamed chunks.

Choices from several prompts (a /v1/completions prompt list) are numbered
`prompt_index * n + choice_index`, as OpenAI does. The responses are folded by the client
library's `CompletionBuilder`, one per prompt; this module only shapes the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from conduit.common.results import Choice, Completion, CompletionBuilder, ToolCall
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import finish_reason_name, new_tool_call_id

from .openai_to_proto import GenerationPlan

# What OpenAI reports for a probability too small to represent.
_MIN_LOGPROB = -9999.0


def finish_reason(name: str | None) -> str:
    """OpenAI always names one: "stop" for a choice the engine gave no reason for."""
    return name or "stop"


def logprob_value(value: float) -> float | None:
    """JSON has no NaN or infinity: NaN (no logprob, e.g. the first prompt token) -> null."""
    if math.isnan(value):
        return None
    return max(value, _MIN_LOGPROB)


# ------------------------------------------------------------------ logprobs


def chat_logprobs(entries: list[pb.TokenLogprob]) -> dict[str, Any]:
    def item(t: pb.TokenLogprob | pb.TopLogprob) -> dict[str, Any]:
        return {"token": t.token, "logprob": logprob_value(t.logprob), "bytes": list(t.bytes or t.token.encode())}

    return {
        "content": [{**item(e), "top_logprobs": [item(t) for t in e.top_logprobs]} for e in entries],
        "refusal": None,
    }


def completion_logprobs(entries: list[pb.TokenLogprob], text_offset: int) -> dict[str, Any]:
    """Legacy logprobs; `text_offset` counts characters from the start of the choice's `text`."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for e in entries:
        value = logprob_value(e.logprob)
        tokens.append(e.token)
        token_logprobs.append(value)
        top.append(None if value is None else {t.token: logprob_value(t.logprob) for t in e.top_logprobs})
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _merge_completion_logprobs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for part in parts:
        for key, values in merged.items():
            values.extend(part[key])
    return merged


def echo_text(plan: GenerationPlan, prompt_index: int, prompt: pb.PromptInfo) -> str:
    """The prompt to prepend for `echo`: the engine's text, else the prompt as sent or its tokens."""
    if not plan.echo:
        return ""
    request = plan.requests[prompt_index]
    return prompt.prompt_text or request.text or "".join(t.token for t in prompt.prompt_logprobs)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens:  # a model that thought (others' usage is as it always was)
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def reasoning_fields(reasoning: str) -> dict[str, str]:
    """A message's (or delta's) thinking: `reasoning_content` as DeepSeek names it (most clients
    read that), and `reasoning` as vLLM now does. Nothing for a model that did not think."""
    return {"reasoning_content": reasoning, "reasoning": reasoning} if reasoning else {}


# ------------------------------------------------------------------ whole responses


class UsageTally:
    """Usage without keeping the text (streams keep only this): prompt (and cached) tokens once per
    prompt, whatever n; the latest completion-token count of every choice."""

    def __init__(self) -> None:
        self._prompts: dict[int, pb.PromptInfo] = {}
        self._completion_tokens: dict[tuple[int, int], int] = {}
        self._reasoning_tokens: dict[tuple[int, int], int] = {}

    def add(self, prompt_index: int, response: pb.GenerateResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self._prompts[prompt_index] = response.prompt
        elif kind in ("chunk", "final"):
            part = response.chunk if kind == "chunk" else response.final
            self._completion_tokens[prompt_index, part.index] = part.completion_tokens
            if kind == "final":
                self._reasoning_tokens[prompt_index, part.index] = part.reasoning_tokens

    def usage(self) -> dict[str, Any]:
        return usage(sum(p.prompt_tokens for p in self._prompts.values()), sum(self._completion_tokens.values()),
                     sum(p.cached_tokens for p in self._prompts.values()), sum(self._reasoning_tokens.values()))


class Collector:
    """The responses of every Generate call of one HTTP request, folded per prompt."""

    def __init__(self) -> None:
        self._prompts: dict[int, CompletionBuilder] = {}
        self._tally = UsageTally()

    def add(self, prompt_index: int, response: pb.GenerateResponse) -> None:
        self._prompts.setdefault(prompt_index, CompletionBuilder()).add(response)
        self._tally.add(prompt_index, response)

    def completion(self, prompt_index: int) -> Completion:
        return self._prompts.get(prompt_index, CompletionBuilder()).build()

    def usage(self) -> dict[str, Any]:
        return self._tally.usage()

    def ranked(self, prompt_index: int, n: int, best_of: int) -> list[Choice]:
        """The choices to return for one prompt: all of them, or the best n of best_of."""
        by_index = {c.index: c for c in self.completion(prompt_index).choices}
        choices = [by_index.get(i, Choice(i)) for i in range(best_of)]
        if best_of > n:
            choices = sorted(choices, key=cumulative_logprob, reverse=True)[:n]
        return choices


def cumulative_logprob(choice: Choice) -> float:
    return sum(e.logprob for e in choice.logprobs if not math.isnan(e.logprob))


def tool_call_object(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id or new_tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def chat_response(
    response_id: str, created: int, model: str, plan: GenerationPlan, collected: Collector
) -> dict[str, Any]:
    choices = []
    for i, choice in enumerate(collected.ranked(0, plan.n, plan.best_of)):
        # Also a call cut off by max_tokens (finish_reason "length").
        tool_calls = [tool_call_object(c) for c in choice.tool_calls]
        message: dict[str, Any] = {
            "role": "assistant",
            # No answer after thinking (cut by max_tokens inside it): null, not the thinking.
            "content": choice.text or (None if tool_calls or choice.reasoning else ""),
            "refusal": None,
            **reasoning_fields(choice.reasoning),
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(choice.logprobs) if plan.logprobs else None,
                "finish_reason": finish_reason(choice.finish_reason),
            }
        )
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": collected.usage(),
        "system_fingerprint": None,
    }


def completion_response(
    response_id: str, created: int, model: str, plan: GenerationPlan, collected: Collector
) -> dict[str, Any]:
    choices = []
    for p in range(len(plan.requests)):
        prompt = collected.completion(p).prompt
        echoed = echo_text(plan, p, prompt)
        for i, choice in enumerate(collected.ranked(p, plan.n, plan.best_of)):
            logprobs = None
            if plan.logprobs:
                parts = [completion_logprobs(list(prompt.prompt_logprobs), 0)] if plan.echo else []
                parts.append(completion_logprobs(choice.logprobs, len(echoed)))
                logprobs = _merge_completion_logprobs(parts)
            choices.append(
                {
                    "index": p * plan.n + i,
                    "text": echoed + choice.text,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(choice.finish_reason),
                }
            )
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": collected.usage(),
        "system_fingerprint": None,
    }


# ------------------------------------------------------------------ streamed chunks


@dataclass
class _StreamChoice:
    text_offset: int = 0
    tool_ids: dict[int, str] = field(default_factory=dict)


class _StreamTranslator:
    """Shared state of a streamed response: chunk envelope, the token counts so far (for usage),
    per-choice progress."""

    object_name = ""

    def __init__(self, response_id: str, created: int, model: str, plan: GenerationPlan) -> None:
        self.response_id, self.created, self.model, self.plan = response_id, created, model, plan
        self.tally = UsageTally()
        self.choices: dict[tuple[int, int], _StreamChoice] = {}

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.response_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "system_fingerprint": None,
        }
        if self.plan.include_usage:
            chunk["usage"] = None
        return chunk

    def index(self, prompt_index: int, choice: int) -> int:
        return prompt_index * self.plan.n + choice

    def state(self, prompt_index: int, choice: int) -> _StreamChoice:
        return self.choices.setdefault((prompt_index, choice), _StreamChoice())

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[dict[str, Any]]:
        self.tally.add(prompt_index, response)
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            return self.on_prompt(prompt_index, response.prompt)
        if kind == "chunk":
            return self.on_chunk(prompt_index, response.chunk)
        if kind == "final":
            return self.on_final(prompt_index, response.final)
        return []

    def finish(self) -> list[dict[str, Any]]:
        """The usage chunk, when the client asked for it with stream_options.include_usage."""
        if not self.plan.include_usage:
            return []
        chunk = self.envelope([])
        chunk["usage"] = self.tally.usage()
        return [chunk]

    def on_prompt(self, prompt_index: int, prompt: pb.PromptInfo) -> list[dict[str, Any]]:
        raise NotImplementedError

    def on_chunk(self, prompt_index: int, chunk: pb.Chunk) -> list[dict[str, Any]]:
        raise NotImplementedError

    def on_final(self, prompt_index: int, final: pb.Final) -> list[dict[str, Any]]:
        raise NotImplementedError


class ChatStreamTranslator(_StreamTranslator):
    object_name = "chat.completion.chunk"

    def _choice(self, index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def on_prompt(self, prompt_index: int, prompt: pb.PromptInfo) -> list[dict[str, Any]]:
        return [self.envelope([self._choice(i, {"role": "assistant", "content": ""})]) for i in range(self.plan.n)]

    def _tool_deltas(self, state: _StreamChoice, deltas: list[pb.ToolCallDelta]) -> list[dict[str, Any]]:
        """One entry per call in the chunk, as OpenAI sends: a message holding several steps' tokens
        (--stream-interval) may carry a call's header and argument pieces together."""
        out: dict[int, dict[str, Any]] = {}
        for d in deltas:
            if d.index in out:
                out[d.index]["function"]["arguments"] += d.arguments
            elif d.index not in state.tool_ids:
                state.tool_ids[d.index] = d.id or new_tool_call_id()
                out[d.index] = {"index": d.index, "id": state.tool_ids[d.index], "type": "function",
                                "function": {"name": d.name, "arguments": d.arguments}}
            else:
                out[d.index] = {"index": d.index, "function": {"arguments": d.arguments}}
        return list(out.values())

    def on_chunk(self, prompt_index: int, chunk: pb.Chunk) -> list[dict[str, Any]]:
        state = self.state(prompt_index, chunk.index)
        delta: dict[str, Any] = reasoning_fields(chunk.reasoning_text)
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = self._tool_deltas(state, list(chunk.tool_calls))
        logprobs = chat_logprobs(list(chunk.logprobs)) if self.plan.logprobs and chunk.logprobs else None
        if not delta and logprobs is None:
            return []
        if not delta:
            delta["content"] = ""
        return [self.envelope([self._choice(self.index(prompt_index, chunk.index), delta, logprobs)])]

    def on_final(self, prompt_index: int, final: pb.Final) -> list[dict[str, Any]]:
        state = self.state(prompt_index, final.index)
        index = self.index(prompt_index, final.index)
        reason = finish_reason(finish_reason_name(final.finish_reason))
        out = []
        if final.finish_reason == pb.FINISH_REASON_TOOL_CALLS and not state.tool_ids and final.tool_calls:
            # The engine did not stream the calls piecewise: send each whole, as one delta.
            deltas = [
                pb.ToolCallDelta(index=k, id=c.id, name=c.name, arguments=c.arguments)
                for k, c in enumerate(final.tool_calls)
            ]
            out.append(self.envelope([self._choice(index, {"tool_calls": self._tool_deltas(state, deltas)})]))
        out.append(self.envelope([self._choice(index, {}, None, reason)]))
        return out


class CompletionStreamTranslator(_StreamTranslator):
    object_name = "text_completion"

    def _choice(self, index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def on_prompt(self, prompt_index: int, prompt: pb.PromptInfo) -> list[dict[str, Any]]:
        if not self.plan.echo:
            return []
        out = []
        echoed = echo_text(self.plan, prompt_index, prompt)
        for i in range(self.plan.n):
            state = self.state(prompt_index, i)
            logprobs = completion_logprobs(list(prompt.prompt_logprobs), 0) if self.plan.logprobs else None
            state.text_offset = len(echoed)
            out.append(self.envelope([self._choice(self.index(prompt_index, i), echoed, logprobs)]))
        return out

    def on_chunk(self, prompt_index: int, chunk: pb.Chunk) -> list[dict[str, Any]]:
        state = self.state(prompt_index, chunk.index)
        logprobs = None
        if self.plan.logprobs and chunk.logprobs:
            logprobs = completion_logprobs(list(chunk.logprobs), state.text_offset)
            state.text_offset += sum(len(e.token) for e in chunk.logprobs)
        if not chunk.text and logprobs is None:
            return []
        return [self.envelope([self._choice(self.index(prompt_index, chunk.index), chunk.text, logprobs)])]

    def on_final(self, prompt_index: int, final: pb.Final) -> list[dict[str, Any]]:
        index = self.index(prompt_index, final.index)
        reason = finish_reason(finish_reason_name(final.finish_reason))
        return [self.envelope([self._choice(index, "", None, reason)])]
