"""Validate OpenAI request JSON and translate it into engine `GenerateRequest`s.

Every field is type- and range-checked here so bad input becomes a 400 naming the parameter,
never a 500 and never a surprise inside the engine.

Accepted and ignored (the openai SDK and frameworks send them; they have no engine meaning):
`user`, `metadata`, `store`, `service_tier`, `modalities`, `audio`, `prediction`,
`web_search_options`, `verbosity`, `prompt_cache_key`, `safety_identifier`,
and any other unknown top-level field. `stream_options` is read only when `stream` is true.

Vendor fields (sent through the SDK's `extra_body`): `top_k` (-1 or 0 = off), `min_p`,
`repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, and `structured_outputs`
({"regex": str} | {"grammar": str} | {"json": schema}) for constraints OpenAI has no field for.

Reasoning models (docs/reasoning.md): `reasoning_effort`, and the vendor fields `chat_template_kwargs`
(an object for the chat template, as vLLM and SGLang take it) and `max_reasoning_tokens` (a thinking
budget the engine enforces).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from clients.request_builder import TOOL_CHOICE_MODES
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import LOGIT_BIAS_RANGE, MAX_TOP_LOGPROBS, REASONING_EFFORTS, SAMPLING_RANGES

from ..errors import invalid
from ..fields import (UINT32_MAX, bool_field, dict_value, int_field, is_int, is_number, list_value, number_field, str_value,
                     token_id)
from ..limits import DEFAULT_LIMITS, MAX_COMPLETION_LOGPROBS, MAX_PROMPTS, RequestLimits

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = ("system", "developer", "user", "assistant", "tool")


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
    top_logprobs: int
    echo: bool


# ------------------------------------------------------------------ shared fields


def model_field(body: dict) -> str:
    if body.get("model") is None:
        raise invalid("you must provide a model parameter.", "model")
    return str_value(body["model"], "model", allow_empty=False)


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = bool(bool_field(body, "stream"))
    options = body.get("stream_options")
    if options is None or not stream:
        return stream, False
    include_usage = bool_field(dict_value(options, "stream_options"), "include_usage", "stream_options.include_usage")
    return stream, bool(include_usage)


def _seed(body: dict) -> int | None:
    """OpenAI seeds are signed 64-bit; the engine's are unsigned, so negatives wrap (deterministically)."""
    seed = int_field(body, "seed", -(2**63), 2**64 - 1)
    return None if seed is None else seed % 2**64


def _logit_bias(body: dict) -> dict[int, float]:
    value = body.get("logit_bias")
    if value is None:
        return {}
    bias: dict[int, float] = {}
    for key, weight in dict_value(value, "logit_bias").items():
        if not (isinstance(key, str) and key.isdigit() and int(key) <= UINT32_MAX):
            raise invalid(f"'logit_bias' keys must be token ids as strings, got {json.dumps(key)}.", "logit_bias")
        if not is_number(weight) or weight not in LOGIT_BIAS_RANGE:
            raise invalid(
                f"'logit_bias' values must be numbers in {LOGIT_BIAS_RANGE}, got {json.dumps(weight)}.", "logit_bias"
            )
        bias[int(key)] = float(weight)
    return bias


def _sampling(body: dict) -> pb.SamplingParams:
    params = pb.SamplingParams(logit_bias=_logit_bias(body))
    for name, allowed in SAMPLING_RANGES.items():
        value = number_field(body, name, allowed)
        if value is not None:
            setattr(params, name, value)
    top_k = int_field(body, "top_k", -1, 2**31 - 1)
    if top_k is not None:
        params.top_k = max(top_k, 0)  # vLLM spells "off" as -1
    seed = _seed(body)
    if seed is not None:
        params.seed = seed
    return params


def _stop(body: dict, max_stop: int) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else list_value(value, "stop", allow_empty=True)
    if len(stops) > max_stop:
        raise invalid(f"'stop' may hold at most {max_stop} strings on this server, got {len(stops)}.", "stop")
    for stop in stops:
        str_value(stop, "stop", allow_empty=False)
    return stops


def _stopping(body: dict, max_tokens: int | None, limits: RequestLimits) -> pb.StoppingParams:
    params = pb.StoppingParams(stop=_stop(body, limits.max_stop))
    if max_tokens is not None:
        params.max_tokens = max_tokens
    params.min_tokens = int_field(body, "min_tokens", 0, UINT32_MAX) or 0
    params.ignore_eos = bool(bool_field(body, "ignore_eos"))
    ids = body.get("stop_token_ids")
    if ids is not None:
        params.stop_token_ids.extend(
            token_id(t, "stop_token_ids") for t in list_value(ids, "stop_token_ids", allow_empty=True)
        )
    return params


def schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise invalid(f"'{param}' is not valid JSON.", param) from None
    if not isinstance(schema, (dict, bool)):
        raise invalid(f"'{param}' must be a JSON Schema object.", param)
    return json.dumps(schema)


def _response_format(value: Any) -> pb.Constraint | None:
    fmt = dict_value(value, "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.Constraint(json_object=True)
    if kind == "json_schema":
        spec = dict_value(fmt.get("json_schema"), "response_format.json_schema")
        if spec.get("name") is not None:
            str_value(spec["name"], "response_format.json_schema.name")
        if spec.get("schema") is None:
            return pb.Constraint(json_object=True)
        return pb.Constraint(json_schema=schema_text(spec["schema"], "response_format.json_schema.schema"))
    raise invalid(
        f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {json.dumps(kind)}.",
        "response_format.type",
    )


def _structured_outputs(value: Any) -> pb.Constraint:
    spec = dict_value(value, "structured_outputs")
    kinds = [k for k in ("regex", "grammar", "json") if spec.get(k) is not None]
    if len(kinds) != 1:
        raise invalid(
            "'structured_outputs' must set exactly one of 'regex', 'grammar' or 'json'.", "structured_outputs"
        )
    kind = kinds[0]
    if kind == "json":
        return pb.Constraint(json_schema=schema_text(spec["json"], "structured_outputs.json"))
    text = str_value(spec[kind], f"structured_outputs.{kind}", allow_empty=False)
    return pb.Constraint(regex=text) if kind == "regex" else pb.Constraint(grammar=text)


def _constraint(body: dict) -> pb.Constraint | None:
    from_format = None if body.get("response_format") is None else _response_format(body["response_format"])
    from_vendor = None if body.get("structured_outputs") is None else _structured_outputs(body["structured_outputs"])
    if from_format is not None and from_vendor is not None:
        raise invalid("Use either 'response_format' or 'structured_outputs', not both.", "structured_outputs")
    return from_format or from_vendor


# ------------------------------------------------------------------ chat


def _content_text(content: Any, param: str) -> str:
    """String content, or an array of text parts joined by newlines (as vLLM does). Text only."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise invalid(f"'{param}' must be a string or a non-empty array of content parts.", param)
    parts = content
    texts = []
    for j, part in enumerate(parts):
        part = dict_value(part, f"{param}[{j}]")
        kind = part.get("type")
        if kind in ("text", "refusal"):
            texts.append(str_value(part.get(kind), f"{param}[{j}].{kind}"))
        else:
            raise invalid(
                f"Content parts of type {json.dumps(kind)} are not supported; this model accepts text only.",
                f"{param}[{j}].type",
            )
    return "\n".join(texts)


def _tool_call(value: Any, param: str) -> pb.ToolCall:
    call = dict_value(value, param)
    if call.get("type", "function") != "function":
        raise invalid(f"'{param}.type' must be 'function'.", f"{param}.type")
    function = dict_value(call.get("function"), f"{param}.function")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):  # some clients send the object itself
        arguments = json.dumps(arguments)
    return pb.ToolCall(
        id=str_value(call.get("id", ""), f"{param}.id"),
        name=str_value(function.get("name"), f"{param}.function.name", allow_empty=False),
        arguments=str_value(arguments, f"{param}.function.arguments"),
    )


def chat_message(value: Any, i: int) -> pb.ChatMessage:
    param = f"messages[{i}]"
    msg = dict_value(value, param)
    role = msg.get("role")
    if role not in _ROLES:
        raise invalid(f"'{param}.role' must be one of {', '.join(_ROLES)}; got {json.dumps(role)}.", f"{param}.role")
    out = pb.ChatMessage(role=role)
    if msg.get("name") is not None:
        out.name = str_value(msg["name"], f"{param}.name")
    if role == "assistant" and msg.get("tool_calls") is not None:
        calls = list_value(msg["tool_calls"], f"{param}.tool_calls", allow_empty=True)
        out.tool_calls.extend(_tool_call(c, f"{param}.tool_calls[{k}]") for k, c in enumerate(calls))
    if role == "tool":
        out.tool_call_id = str_value(msg.get("tool_call_id"), f"{param}.tool_call_id", allow_empty=False)
    content = msg.get("content")
    if content is None:
        if role != "assistant":
            raise invalid(f"'{param}.content' is required for role '{role}'.", f"{param}.content")
    else:
        out.content = _content_text(content, f"{param}.content")
    return out


def _tools(body: dict) -> list[pb.Tool]:
    value = body.get("tools")
    if value is None:
        return []
    tools = []
    for k, item in enumerate(list_value(value, "tools", allow_empty=True)):
        param = f"tools[{k}]"
        tool = dict_value(item, param)
        if tool.get("type") != "function":
            raise invalid(f"'{param}.type' must be 'function'.", f"{param}.type")
        function = dict_value(tool.get("function"), f"{param}.function")
        name = str_value(function.get("name"), f"{param}.function.name")
        if not TOOL_NAME.match(name):
            raise invalid(
                f"'{param}.function.name' must match ^[a-zA-Z0-9_-]{{1,64}}$, got {json.dumps(name)}.",
                f"{param}.function.name",
            )
        params = function.get("parameters")
        tools.append(
            pb.Tool(
                name=name,
                description=str_value(function.get("description") or "", f"{param}.function.description"),
                parameters_json="" if params is None else schema_text(params, f"{param}.function.parameters"),
            )
        )
    return tools


def _tool_choice(body: dict, tools: list[pb.Tool]) -> pb.ToolChoice:
    value = body.get("tool_choice")
    if value is None:
        return pb.ToolChoice(mode=pb.ToolChoice.MODE_AUTO)
    if isinstance(value, str):
        if value not in TOOL_CHOICE_MODES:
            raise invalid(
                f"'tool_choice' must be 'none', 'auto', 'required' or an object, got {json.dumps(value)}.",
                "tool_choice",
            )
        if value == "required" and not tools:
            raise invalid("'tool_choice' is 'required' but no 'tools' were given.", "tool_choice")
        return pb.ToolChoice(mode=TOOL_CHOICE_MODES[value])
    choice = dict_value(value, "tool_choice")
    if choice.get("type") != "function":
        raise invalid("'tool_choice.type' must be 'function'.", "tool_choice.type")
    name = str_value(dict_value(choice.get("function"), "tool_choice.function").get("name"), "tool_choice.function.name")
    if name not in {t.name for t in tools}:
        raise invalid(f"'tool_choice' names the function '{name}', which is not in 'tools'.", "tool_choice")
    return pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name=name)


def _reject_legacy_functions(body: dict) -> None:
    for key in ("functions", "function_call"):
        if body.get(key) is not None:
            raise invalid(f"'{key}' is deprecated and not supported; use 'tools' and 'tool_choice'.", key)


def max_tokens_field(body: dict, keys: tuple[str, ...], lo: int, limits: RequestLimits) -> int | None:
    """The first of `keys` that is set, within [lo, the operator's cap]."""
    for key in keys:
        value = int_field(body, key, lo, UINT32_MAX)
        if value is None:
            continue
        if limits.max_tokens is not None and value > limits.max_tokens:
            raise invalid(f"'{key}' may be at most {limits.max_tokens} on this server, got {value}.", key)
        return value
    return None


def _n(body: dict, key: str, limits: RequestLimits) -> int | None:
    value = int_field(body, key, 1, UINT32_MAX)
    if value is not None and value > limits.max_n:
        raise invalid(f"'{key}' may be at most {limits.max_n} on this server, got {value}.", key)
    return value


def check_prompt_chars(chars: int, param: str, limits: RequestLimits) -> None:
    if chars > limits.max_prompt_chars:
        raise invalid(
            f"'{param}' may hold at most {limits.max_prompt_chars} characters of prompt text on this server, "
            f"got {chars}.",
            param,
        )


def reasoning_options(chat: pb.ChatInput, effort: Any, kwargs: Any, prefix: str) -> None:
    """reasoning_effort and chat_template_kwargs onto the chat (`prefix`: where they sit in the body,
    for error params: "" or "reasoning.")."""
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise invalid(f"'{prefix}{'effort' if prefix else 'reasoning_effort'}' must be one of "
                          f"{', '.join(REASONING_EFFORTS)}, got {json.dumps(effort)}.",
                          f"{prefix}effort" if prefix else "reasoning_effort")
        chat.reasoning_effort = effort
    if kwargs is not None:
        chat.chat_template_kwargs = json.dumps(dict_value(kwargs, "chat_template_kwargs"))


def chat_prompt_chars(messages: list[pb.ChatMessage], tools: list[pb.Tool]) -> int:
    """Characters the chat prompt is rendered from: message contents, names and tool-call
    arguments, and the tools' names, descriptions and parameter schemas."""
    chars = sum(len(t.name) + len(t.description) + len(t.parameters_json) for t in tools)
    for m in messages:
        chars += len(m.content) + len(m.name) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return chars


def parse_chat(body: dict, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> GenerationPlan:
    """Validate a /v1/chat/completions body and build its single GenerateRequest."""
    model = model_field(body)
    _reject_legacy_functions(body)
    items = list_value(body.get("messages"), "messages")
    if len(items) > limits.max_messages:
        raise invalid(
            f"'messages' may hold at most {limits.max_messages} messages on this server, got {len(items)}.",
            "messages",
        )
    messages = [chat_message(m, i) for i, m in enumerate(items)]
    tools = _tools(body)
    check_prompt_chars(chat_prompt_chars(messages, tools), "messages", limits)
    chat = pb.ChatInput(messages=messages, tools=tools, tool_choice=_tool_choice(body, tools))
    parallel = bool_field(body, "parallel_tool_calls")
    if parallel is not None:
        chat.parallel_tool_calls = parallel
    reasoning_options(chat, body.get("reasoning_effort"), body.get("chat_template_kwargs"), "")
    stream, include_usage = _stream(body)
    n = _n(body, "n", limits) or 1
    logprobs = bool(bool_field(body, "logprobs"))
    top_logprobs = int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise invalid("'logprobs' must be true when 'top_logprobs' is set.", "logprobs")
    max_tokens = max_tokens_field(body, ("max_completion_tokens", "max_tokens"), 1, limits)
    if max_tokens is None:
        max_tokens = limits.max_tokens  # the cap bounds a request that names no limit too
    request = pb.GenerateRequest(
        request_id=request_id,
        model=model,
        chat=chat,
        sampling=_sampling(body),
        stopping=_stopping(body, max_tokens, limits),
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
    budget = int_field(body, "max_reasoning_tokens", 0, UINT32_MAX)
    if budget is not None:
        request.max_reasoning_tokens = budget
    constraint = _constraint(body)
    if constraint is not None:
        request.constraint.CopyFrom(constraint)
    return GenerationPlan(model, [request], n, n, stream, include_usage, logprobs, top_logprobs, echo=False)


# ------------------------------------------------------------------ completions


def _prompts(value: Any) -> list[str | list[int]]:
    """A string, strings, token ids, or lists of token ids -> one entry per prompt."""
    if value is None:
        raise invalid("you must provide a prompt parameter.", "prompt")
    if isinstance(value, str):
        return [value]
    items = list_value(value, "prompt")
    if all(isinstance(p, str) for p in items):
        prompts: list[str | list[int]] = list(items)
    elif all(is_int(p) for p in items):
        prompts = [[token_id(t, "prompt") for t in items]]
    elif all(isinstance(p, list) for p in items):
        prompts = [[token_id(t, f"prompt[{i}]") for t in list_value(p, f"prompt[{i}]")] for i, p in enumerate(items)]
    else:
        raise invalid(
            "'prompt' must be a string, an array of strings, an array of token ids or an array of token-id arrays.",
            "prompt",
        )
    if len(prompts) > MAX_PROMPTS:
        raise invalid(f"'prompt' may hold at most {MAX_PROMPTS} prompts, got {len(prompts)}.", "prompt")
    return prompts


def parse_completion(body: dict, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> GenerationPlan:
    """Validate a /v1/completions body and build one GenerateRequest per prompt."""
    model = model_field(body)
    prompts = _prompts(body.get("prompt"))
    # Token-id prompts count one per id.
    check_prompt_chars(sum(len(p) for p in prompts), "prompt", limits)
    suffix = body.get("suffix")
    if suffix is not None and str_value(suffix, "suffix"):
        raise invalid("'suffix' is not supported: the model has no fill-in-the-middle support.", "suffix")
    stream, include_usage = _stream(body)
    n = _n(body, "n", limits) or 1
    best_of = _n(body, "best_of", limits)
    if best_of is None:
        best_of = n
    if best_of < n:
        raise invalid(f"'best_of' ({best_of}) must be greater than or equal to 'n' ({n}).", "best_of")
    if stream and best_of > n:
        raise invalid("'best_of' greater than 'n' cannot be used with 'stream'.", "best_of")
    top = int_field(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    echo = bool(bool_field(body, "echo"))
    max_tokens = max_tokens_field(body, ("max_tokens",), 0, limits)
    if max_tokens is None:
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
        if limits.max_tokens is not None:
            max_tokens = min(max_tokens, limits.max_tokens)
    sampling, stopping = _sampling(body), _stopping(body, max_tokens, limits)
    constraint = _constraint(body)
    requests = []
    for i, prompt in enumerate(prompts):
        request = pb.GenerateRequest(
            request_id=request_id if len(prompts) == 1 else f"{request_id}-{i}",
            model=model,
            sampling=sampling,
            stopping=stopping,
            n=best_of,
            # Ranking best_of candidates needs each token's logprob even when the client did not ask.
            logprobs=top is not None or best_of > n,
            top_logprobs=top or 0,
            echo=echo,
        )
        if isinstance(prompt, str):
            request.text = prompt
        else:
            request.token_ids.ids.extend(prompt)
        if constraint is not None:
            request.constraint.CopyFrom(constraint)
        requests.append(request)
    return GenerationPlan(model, requests, n, best_of, stream, include_usage, top is not None, top or 0, echo)
