"""Engine responses -> OpenAI objects: whole responses (a `Collector`) and streamed chunks (stream_fold's events).
Choices from several prompts (a /v1/completions prompt list) are numbered `prompt_index * n + choice`,
as OpenAI does."""

from __future__ import annotations

import math
from typing import Any

from conduit_common.results import Choice, Completion, CompletionBuilder, Usage
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import new_tool_call_id

from .. import sse
from ..errors import APIError
from ..protocol.logprobs import logprob_value, token_logprobs
from .request import GenerationPlan
from ..stream_fold import (ChoiceEnd, Event, Finish, PromptRead, ReasoningDelta, StreamFold, TextDelta,
                           ToolCallArguments, ToolCallStart)


def finish_reason(reason: str | None) -> str:
    """OpenAI's word for why a choice ended is the neutral name; "stop" for a choice given no reason."""
    return str(reason or Finish.STOP)


def chat_logprobs(entries: list[pb.TokenLogprob]) -> dict[str, Any]:
    return {"content": token_logprobs(entries), "refusal": None}


def completion_logprobs(entries: list[pb.TokenLogprob], text_offset: int) -> dict[str, Any]:
    """Legacy logprobs; `text_offset` counts characters from the start of the choice's `text`."""
    tokens, values, top, offsets = [], [], [], []
    for e in entries:
        value = logprob_value(e.logprob)
        tokens.append(e.token)
        values.append(value)
        top.append(None if value is None else {t.token: logprob_value(t.logprob) for t in e.top_logprobs})
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets}


def echo_text(plan: GenerationPlan, prompt_index: int, prompt: pb.PromptInfo) -> str:
    """The prompt to prepend for `echo`: the engine's text, else the prompt as sent or its tokens."""
    if not plan.echo:
        return ""
    request = plan.requests[prompt_index]
    return prompt.prompt_text or request.text or "".join(t.token for t in prompt.prompt_logprobs)


def usage(tally: Usage) -> dict[str, Any]:
    out = {"prompt_tokens": tally.prompt_tokens, "completion_tokens": tally.completion_tokens,
           "total_tokens": tally.prompt_tokens + tally.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": tally.cached_tokens}}
    if tally.reasoning_tokens:  # a model that thought (others' usage is as it always was)
        out["completion_tokens_details"] = {"reasoning_tokens": tally.reasoning_tokens}
    return out


def reasoning_fields(reasoning: str) -> dict[str, str]:
    """A message's (or delta's) thinking: `reasoning_content` as DeepSeek names it (most clients
    read that), and `reasoning` as vLLM now does. Nothing for a model that did not think."""
    return {"reasoning_content": reasoning, "reasoning": reasoning} if reasoning else {}


class Collector:
    """A whole answer: the responses of every Generate call of one HTTP request, folded per prompt."""

    def __init__(self) -> None:
        self._prompts: dict[int, CompletionBuilder] = {}

    def add(self, prompt_index: int, response: pb.GenerateResponse) -> None:
        self._prompts.setdefault(prompt_index, CompletionBuilder()).add(response)

    def completion(self, prompt_index: int) -> Completion:
        completion = self._prompts.get(prompt_index, CompletionBuilder()).build()
        for call in (call for choice in completion.choices for call in choice.tool_calls):
            call.id = call.id or new_tool_call_id()  # as a stream's ToolCallStart has (the builder keeps it)
        return completion

    def usage(self) -> Usage:
        """Prompt (and cached) tokens once per prompt, whatever n; every choice's completion tokens."""
        prompts = [builder.prompt for builder in self._prompts.values()]
        choices = [choice for builder in self._prompts.values() for choice in builder.choices.values()]
        return Usage(sum(p.prompt_tokens for p in prompts), sum(c.completion_tokens for c in choices),
                     sum(p.cached_tokens for p in prompts), sum(c.reasoning_tokens for c in choices))

    def ranked(self, prompt_index: int, n: int, best_of: int) -> list[Choice]:
        """The choices to return for one prompt: all of them, or the best n of best_of."""
        by_index = {c.index: c for c in self.completion(prompt_index).choices}
        choices = [by_index.get(i, Choice(i)) for i in range(best_of)]
        if best_of > n:
            choices = sorted(choices, key=cumulative_logprob, reverse=True)[:n]
        return choices


def cumulative_logprob(choice: Choice) -> float:
    return sum(e.logprob for e in choice.logprobs if not math.isnan(e.logprob))


def _answer(kind: str, response_id: str, created: int, model: str, choices: list, **rest: Any) -> dict[str, Any]:
    """The object around the choices, whole or a chunk."""
    return {"id": response_id, "object": kind, "created": created, "model": model, "choices": choices, **rest}


def chat_response(
    response_id: str, created: int, model: str, plan: GenerationPlan, collected: Collector
) -> dict[str, Any]:
    choices = []
    for i, choice in enumerate(collected.ranked(0, plan.n, plan.best_of)):
        # Also a call cut off by max_tokens (finish_reason "length").
        tool_calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                      for c in choice.tool_calls]
        message: dict[str, Any] = {
            "role": "assistant",
            # No answer after thinking (cut by max_tokens inside it): null, not the thinking.
            "content": choice.text or (None if tool_calls or choice.reasoning else ""),
            "refusal": None,
            **reasoning_fields(choice.reasoning),
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        logprobs = chat_logprobs(choice.logprobs) if plan.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": logprobs,
                        "finish_reason": finish_reason(choice.finish_reason)})
    return _answer("chat.completion", response_id, created, model, choices, usage=usage(collected.usage()),
                   system_fingerprint=None)


def completion_response(
    response_id: str, created: int, model: str, plan: GenerationPlan, collected: Collector
) -> dict[str, Any]:
    choices = []
    for p in range(len(plan.requests)):
        prompt = collected.completion(p).prompt
        echoed = echo_text(plan, p, prompt)
        for i, choice in enumerate(collected.ranked(p, plan.n, plan.best_of)):
            logprobs = completion_logprobs(choice.logprobs, len(echoed)) if plan.logprobs else None
            if logprobs is not None and plan.echo:  # the prompt's logprobs first
                echoed_logprobs = completion_logprobs(list(prompt.prompt_logprobs), 0)
                logprobs = {key: echoed_logprobs[key] + values for key, values in logprobs.items()}
            choices.append({"index": p * plan.n + i, "text": echoed + choice.text, "logprobs": logprobs,
                            "finish_reason": finish_reason(choice.finish_reason)})
    return _answer("text_completion", response_id, created, model, choices, usage=usage(collected.usage()),
                   system_fingerprint=None)


class _StreamTranslator:
    """A streamed response's chunks, formatted from the fold's events: the chunk envelope and numbering."""

    object_name = ""

    def __init__(self, response_id: str, created: int, model: str, plan: GenerationPlan) -> None:
        self.response_id, self.created, self.model, self.plan = response_id, created, model, plan
        self._fold = StreamFold()

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = _answer(self.object_name, self.response_id, self.created, self.model, choices, system_fingerprint=None)
        if self.plan.include_usage:
            chunk["usage"] = None
        return chunk

    def index(self, prompt_index: int, choice: int) -> int:
        return prompt_index * self.plan.n + choice

    def chunk(self, index: int, content: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        """A chunk of one choice; `content`: its delta (chat) or its text (completions)."""
        return self.envelope([{"index": index, **content, "logprobs": logprobs, "finish_reason": finish}])

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[dict[str, Any]]:
        return self.chunks(self._fold.on_response(prompt_index, response))

    def finish(self) -> list[dict[str, Any]]:
        """The usage chunk, when the client asked for it with stream_options.include_usage."""
        if not self.plan.include_usage:
            return []
        return [{**self.envelope([]), "usage": usage(self._fold.usage())}]

    def chunks(self, events: list[Event]) -> list[dict[str, Any]]:
        raise NotImplementedError


class ChatStreamTranslator(_StreamTranslator):
    """One chunk per engine response (its reasoning, text, logprobs and tool-call pieces in one
    delta, one entry per call as OpenAI sends), and one chunk for each choice's end."""

    object_name = "chat.completion.chunk"

    def chunks(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        delta: dict[str, Any] = {}
        calls: dict[int, dict[str, Any]] = {}
        logprobs = None
        index = 0
        for e in events:
            if isinstance(e, PromptRead):
                out += [self.chunk(i, {"delta": {"role": "assistant", "content": ""}}) for i in range(self.plan.n)]
                continue
            index = self.index(e.prompt_index, e.choice)
            if isinstance(e, ReasoningDelta):
                delta.update(reasoning_fields(e.text))
            elif isinstance(e, TextDelta):
                if e.text:
                    delta["content"] = e.text
                if self.plan.logprobs and e.logprobs:
                    logprobs = chat_logprobs(e.logprobs)
            elif isinstance(e, ToolCallStart):
                calls[e.index] = {"index": e.index, "id": e.id, "type": "function",
                                  "function": {"name": e.name, "arguments": ""}}
            elif isinstance(e, ToolCallArguments):
                entry = calls.setdefault(e.index, {"index": e.index, "function": {"arguments": ""}})
                entry["function"]["arguments"] += e.arguments
            elif isinstance(e, ChoiceEnd):
                out += self._delta(index, delta, calls, logprobs)
                delta, calls, logprobs = {}, {}, None
                out.append(self.chunk(index, {"delta": {}}, None, finish_reason(e.reason)))
        return out + self._delta(index, delta, calls, logprobs)

    def _delta(self, index: int, delta: dict[str, Any], calls: dict[int, dict[str, Any]], logprobs: Any) -> list[dict]:
        if calls:
            delta["tool_calls"] = list(calls.values())
        if not delta and logprobs is None:
            return []
        if not delta:
            delta["content"] = ""
        return [self.chunk(index, {"delta": delta}, logprobs)]


class CompletionStreamTranslator(_StreamTranslator):
    object_name = "text_completion"

    def __init__(self, response_id: str, created: int, model: str, plan: GenerationPlan) -> None:
        super().__init__(response_id, created, model, plan)
        # Characters before each choice's next token (the logprobs' text_offset), per (prompt, choice).
        self._offsets: dict[tuple[int, int], int] = {}

    def chunks(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, PromptRead):
                out += self._echo(e.prompt_index, e.prompt)
            elif isinstance(e, TextDelta):
                logprobs = None
                if self.plan.logprobs and e.logprobs:
                    offset = self._offsets.get((e.prompt_index, e.choice), 0)
                    logprobs = completion_logprobs(e.logprobs, offset)
                    self._offsets[e.prompt_index, e.choice] = offset + sum(len(t.token) for t in e.logprobs)
                if e.text or logprobs is not None:
                    out.append(self.chunk(self.index(e.prompt_index, e.choice), {"text": e.text}, logprobs))
            elif isinstance(e, ChoiceEnd):
                index = self.index(e.prompt_index, e.choice)
                out.append(self.chunk(index, {"text": ""}, None, finish_reason(e.reason)))
        return out

    def _echo(self, prompt_index: int, prompt: pb.PromptInfo) -> list[dict[str, Any]]:
        if not self.plan.echo:
            return []
        out = []
        echoed = echo_text(self.plan, prompt_index, prompt)
        for i in range(self.plan.n):
            logprobs = completion_logprobs(list(prompt.prompt_logprobs), 0) if self.plan.logprobs else None
            self._offsets[prompt_index, i] = len(echoed)
            out.append(self.chunk(self.index(prompt_index, i), {"text": echoed}, logprobs))
        return out


class OpenAIEvents:
    """The relay's EventWriter for chat and legacy completion chunks: `data:` lines, `data: [DONE]`
    when complete, and an OpenAI error object (with no [DONE]) when not."""

    heartbeat = sse.HEARTBEAT

    def __init__(self, translator: ChatStreamTranslator | CompletionStreamTranslator) -> None:
        self._translator = translator

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]:
        return [sse.event(c) for c in self._translator.on_response(prompt_index, response)]

    def finish(self) -> list[bytes]:
        return [sse.event(c) for c in self._translator.finish()] + [sse.DONE]

    def fail(self, error: APIError) -> list[bytes]:
        return [sse.event(error.body())]
