"""OpenAI request JSON -> the engine's `GenerateRequest`s: validated as the typed requests of
protocol.py (each bad field a 400 naming its `param`), then built with the shared builders."""

from __future__ import annotations

from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb

from ..limits import DEFAULT_LIMITS, RequestLimits
from ..protocol.base import parse
from ..protocol.chat import chat_prompt_chars, check_prompt_chars, reasoning_options
from ..protocol.sampling import sampling_params, stopping_params
from .protocol import ChatCompletionRequest, CompletionRequest

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


@dataclass
class GenerationPlan:
    """What one HTTP request asks of the engine: one GenerateRequest per prompt, plus how to answer."""

    model: str
    requests: list[pb.GenerateRequest]
    n: int  # choices returned per prompt
    best_of: int  # choices generated per prompt (>= n); the best n by cumulative logprob are returned
    stream: bool
    include_usage: bool
    logprobs: bool  # whether the client asked for logprobs
    echo: bool = False


def parse_chat(body: dict, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> GenerationPlan:
    """Validate a /v1/chat/completions body and build its single GenerateRequest."""
    request = parse(ChatCompletionRequest, body, limits=limits)
    messages = [m.to_pb() for m in request.messages]
    tools = [t.to_pb() for t in request.tools or ()]
    check_prompt_chars(chat_prompt_chars(messages, tools), "messages", limits)
    chat = pb.ChatInput(messages=messages, tools=tools, tool_choice=request.tool_choice_pb(tools),
                        parallel_tool_calls=request.parallel_tool_calls)
    reasoning_options(chat, request.reasoning_effort, request.chat_template_kwargs)
    # The cap bounds a request that names no limit too.
    max_tokens = request.max_completion_tokens or request.max_tokens or limits.max_tokens
    n = request.n or 1
    generate = pb.GenerateRequest(
        request_id=request_id, model=request.model, chat=chat, sampling=sampling_params(request),
        stopping=stopping_params(request, max_tokens), n=n, logprobs=bool(request.logprobs),
        top_logprobs=request.top_logprobs or 0, constraint=request.constraint(),
        max_reasoning_tokens=request.max_reasoning_tokens)
    return GenerationPlan(request.model, [generate], n, n, bool(request.stream), request.include_usage,
                          bool(request.logprobs))


def parse_completion(body: dict, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> GenerationPlan:
    """Validate a /v1/completions body and build one GenerateRequest per prompt."""
    request = parse(CompletionRequest, body, limits=limits)
    prompts = request.prompt
    check_prompt_chars(sum(len(p) for p in prompts), "prompt", limits)  # token-id prompts count one per id
    n = request.n or 1
    best_of = request.best_of or n
    top = request.logprobs
    max_tokens = request.max_tokens
    if max_tokens is None:
        max_tokens = min(DEFAULT_COMPLETION_MAX_TOKENS, limits.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS)
    sampling, stopping = sampling_params(request), stopping_params(request, max_tokens)
    requests = []
    for i, prompt in enumerate(prompts):
        generate = pb.GenerateRequest(
            request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}",
            model=request.model,
            sampling=sampling,
            stopping=stopping,
            n=best_of,
            # Ranking best_of candidates needs each token's logprob even when the client did not ask.
            logprobs=top is not None or best_of > n,
            top_logprobs=top or 0,
            echo=bool(request.echo),
            constraint=request.constraint(),
        )
        if isinstance(prompt, str):
            generate.text = prompt
        else:
            generate.token_ids.ids.extend(prompt)
        requests.append(generate)
    return GenerationPlan(request.model, requests, n, best_of, bool(request.stream), request.include_usage,
                          top is not None, bool(request.echo))
