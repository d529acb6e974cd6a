"""Engine responses -> OpenAI objects: whole responses and streamed chunks.

Choices from several prompts (a /v1/completions prompt list) are numbered
`prompt_index * n + choice_index`, as OpenAI does.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from conduit.v1 import engine_pb2 as pb

from .openai_to_proto import GenerationPlan

_FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
# What OpenAI reports for a probability too small to represent.
_MIN_LOGPROB = -9999.0


def finish_reason(final: pb.Final) -> str:
    return _FINISH.get(final.finish_reason, "stop")


def logprob_value(value: float) -> float | None:
    """JSON has no NaN or infinity: NaN (no logprob, e.g. the first prompt token) -> null."""
    if math.isnan(value):
        return None
    return max(value, _MIN_LOGPROB)


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


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


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# ------------------------------------------------------------------ whole responses


@dataclass
class ChoiceResult:
    """Everything the engine sent for one choice."""

    text: list[str] = field(default_factory=list)
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    tool_deltas: dict[int, pb.ToolCall] = field(default_factory=dict)
    final: pb.Final | None = None

    def add_chunk(self, chunk: pb.Chunk) -> None:
        self.text.append(chunk.text)
        self.logprobs.extend(chunk.logprobs)
        for delta in chunk.tool_calls:
            call = self.tool_deltas.setdefault(delta.index, pb.ToolCall())
            call.id = call.id or delta.id
            call.name = call.name or delta.name
            call.arguments += delta.arguments

    def cumulative_logprob(self) -> float:
        return sum(e.logprob for e in self.logprobs if not math.isnan(e.logprob))

    def tool_calls(self) -> list[dict[str, Any]]:
        """Final.tool_calls is authoritative; the streamed pieces are a fallback."""
        calls = (
            list(self.final.tool_calls)
            if self.final and self.final.tool_calls
            else list(self.tool_deltas[k] for k in sorted(self.tool_deltas))
        )
        return [
            {
                "id": c.id or new_tool_call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]


class Collector:
    """Accumulates the responses of every Generate call of one HTTP request."""

    def __init__(self) -> None:
        self.prompts: dict[int, pb.PromptInfo] = {}
        self.choices: dict[tuple[int, int], ChoiceResult] = {}

    def add(self, prompt_index: int, response: pb.GenerateResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self.prompts[prompt_index] = response.prompt
        elif kind == "chunk":
            self.choices.setdefault((prompt_index, response.chunk.index), ChoiceResult()).add_chunk(response.chunk)
        elif kind == "final":
            self.choices.setdefault((prompt_index, response.final.index), ChoiceResult()).final = response.final

    def usage(self) -> dict[str, int]:
        prompt = sum(p.prompt_tokens for p in self.prompts.values())  # once per prompt, whatever n
        completion = sum(c.final.completion_tokens for c in self.choices.values() if c.final)
        return usage(prompt, completion)

    def ranked(self, prompt_index: int, n: int, best_of: int) -> list[ChoiceResult]:
        """The choices to return for one prompt: all of them, or the best n of best_of."""
        results = [self.choices.get((prompt_index, i), ChoiceResult()) for i in range(best_of)]
        if best_of > n:
            results = sorted(results, key=ChoiceResult.cumulative_logprob, reverse=True)[:n]
        return results


def chat_response(
    response_id: str, created: int, model: str, plan: GenerationPlan, collected: Collector
) -> dict[str, Any]:
    choices = []
    for i, result in enumerate(collected.ranked(0, plan.n, plan.best_of)):
        text = "".join(result.text)
        tool_calls = (
            result.tool_calls() if result.final else []  # also a call cut off by max_tokens ("length")
        )
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text or (None if tool_calls else ""),
            "refusal": None,
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(result.logprobs) if plan.logprobs else None,
                "finish_reason": finish_reason(result.final) if result.final else "stop",
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
        prompt = collected.prompts.get(p, pb.PromptInfo())
        echoed = echo_text(plan, p, prompt)
        for i, result in enumerate(collected.ranked(p, plan.n, plan.best_of)):
            text = "".join(result.text)
            logprobs = None
            if plan.logprobs:
                parts = [completion_logprobs(list(prompt.prompt_logprobs), 0)] if plan.echo else []
                parts.append(completion_logprobs(result.logprobs, len(echoed)))
                logprobs = _merge_completion_logprobs(parts)
            choices.append(
                {
                    "index": p * plan.n + i,
                    "text": echoed + text,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(result.final) if result.final else "stop",
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
    """Shared state of a streamed response: chunk envelope, usage counts, per-choice progress."""

    object_name = ""

    def __init__(self, response_id: str, created: int, model: str, plan: GenerationPlan) -> None:
        self.response_id, self.created, self.model, self.plan = response_id, created, model, plan
        self.prompt_tokens: dict[int, int] = {}
        self.completion_tokens: dict[tuple[int, int], int] = {}
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
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self.prompt_tokens[prompt_index] = response.prompt.prompt_tokens
            return self.on_prompt(prompt_index, response.prompt)
        if kind == "chunk":
            chunk = response.chunk
            self.completion_tokens[(prompt_index, chunk.index)] = chunk.completion_tokens
            return self.on_chunk(prompt_index, chunk)
        if kind == "final":
            final = response.final
            self.completion_tokens[(prompt_index, final.index)] = final.completion_tokens
            return self.on_final(prompt_index, final)
        return []

    def finish(self) -> list[dict[str, Any]]:
        """The usage chunk, when the client asked for it with stream_options.include_usage."""
        if not self.plan.include_usage:
            return []
        chunk = self.envelope([])
        chunk["usage"] = usage(sum(self.prompt_tokens.values()), sum(self.completion_tokens.values()))
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
        out = []
        for d in deltas:
            item: dict[str, Any] = {"index": d.index}
            if d.index not in state.tool_ids:
                state.tool_ids[d.index] = d.id or new_tool_call_id()
                item.update(
                    id=state.tool_ids[d.index], type="function", function={"name": d.name, "arguments": d.arguments}
                )
            else:
                item["function"] = {"arguments": d.arguments}
            out.append(item)
        return out

    def on_chunk(self, prompt_index: int, chunk: pb.Chunk) -> list[dict[str, Any]]:
        state = self.state(prompt_index, chunk.index)
        delta: dict[str, Any] = {}
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
        out = []
        if final.finish_reason == pb.FINISH_REASON_TOOL_CALLS and not state.tool_ids and final.tool_calls:
            # The engine did not stream the calls piecewise: send each whole, as one delta.
            deltas = [
                pb.ToolCallDelta(index=k, id=c.id, name=c.name, arguments=c.arguments)
                for k, c in enumerate(final.tool_calls)
            ]
            out.append(self.envelope([self._choice(index, {"tool_calls": self._tool_deltas(state, deltas)})]))
        out.append(self.envelope([self._choice(index, {}, None, finish_reason(final))]))
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
        return [self.envelope([self._choice(index, "", None, finish_reason(final))])]
