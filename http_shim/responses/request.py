"""A /v1/responses body -> the chat request the engine already serves, plus what the answer echoes.

The Responses API is chat completions with other spellings: input items become chat messages,
flat function tools become chat tools, `text.format` becomes `response_format`. So this module
checks what is Responses-specific (items, tools, tool_choice, include, metadata, truncation) and
hands a chat body to `parse_chat`, which validates the rest and builds the GenerateRequest exactly
as the chat route does. Errors it raises name chat fields; `responses_param` renames them.

Tools of type `namespace` (functions grouped under one name, as Codex groups its sub-agent tools)
are offered to the model as `NAMESPACE__NAME`, the namespace's description before each function's;
the calls come back as `function_call` items with `name` and `namespace` apart, and such items in
`input` are read the same way. The hosted `web_search` tool (`web_search_preview` too), which Codex
sends by default, is accepted and not offered to the model: this server cannot search the web, and a
model offered a tool nobody runs would call it in vain. The response echoes `tools` as sent, and the
`Conduit-Tools-Not-Offered` header names the tool types left out.

Reasoning models (docs/reasoning.md): `reasoning.effort` is the chat route's `reasoning_effort`; the
thinking comes back as a `reasoning` output item (its text as a `reasoning_text` part, no encrypted
content); `reasoning` items given back in `input` are accepted and dropped from the prompt (the
templates of DeepSeek-R1 and Qwen3 drop earlier turns' thinking too). With `reasoning.summary` set,
the item's summary is the thinking itself (no model here writes summaries; the final item carries
it, no summary events stream).

Refused with a 400 naming them: item types other than messages, reasoning, function calls and their
outputs (images, files, hosted tools' calls, item references), content parts other than text,
tools other than functions, namespaces of functions and web search. Tolerated: unknown top-level
fields and `include` values (as the chat route tolerates unknown fields; `reasoning.encrypted_content`
asks for encrypted reasoning, which Conduit does not write), `store: false`,
`service_tier`, `prompt_cache_key`, `client_metadata` and the like.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import APIError, invalid
from ..fields import dict_value, list_value, str_value
from ..limits import RequestLimits
from ..openai.request import GenerationPlan, parse_chat

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
_TRUNCATION = ("disabled", "auto")
# Hosted tools accepted and not offered to the model (see the module's docstring).
NOT_OFFERED_TOOLS = ("web_search", "web_search_preview")
_NAMESPACE_JOIN = "__"  # NAMESPACE__NAME: the name the model sees for a function in a namespace
# OpenAI's limits on `metadata`.
METADATA_MAX_KEYS, METADATA_MAX_KEY_CHARS, METADATA_MAX_VALUE_CHARS = 16, 64, 512
# Vendor fields (sent through the SDK's extra_body) passed on to the engine as the chat route reads them.
_VENDOR_FIELDS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                  "min_tokens", "ignore_eos", "stop_token_ids", "logit_bias", "chat_template_kwargs",
                  "max_reasoning_tokens")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponsesRequest:
    """One validated /v1/responses request."""

    plan: GenerationPlan
    context: list[dict[str, Any]]  # every input item the answer is generated from (inherited ones first)
    echo: dict[str, Any]  # the request's settings, as the response object repeats them
    stream: bool
    store: bool
    logprobs: bool  # include asks for output_text logprobs
    not_offered: list[str]  # hosted tool types accepted and not offered to the model


# ------------------------------------------------------------------ refusals


def unsupported(what: str, kind: Any, param: str) -> APIError:
    return invalid(f"{what} of type {json.dumps(kind)} are not supported by this server.", param, "unsupported_value")


# ------------------------------------------------------------------ input items


def normalize_items(value: Any) -> list[dict[str, Any]]:
    """`input` as stored and listed: a list of typed items with ids, message content as parts."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items = list_value(value, "input", allow_empty=True)
    out = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        item = dict(dict_value(item, param))
        kind = item.setdefault("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise invalid(f"'{param}.role' must be one of {', '.join(_ROLES)}; got {json.dumps(role)}.",
                              f"{param}.role")
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if role == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content, **({"annotations": []} if role == "assistant" else {})}]
            item.setdefault("id", new_id("msg"))
            item.setdefault("status", "completed")
        elif kind in ("function_call", "function_call_output"):
            item.setdefault("id", new_id("fc" if kind == "function_call" else "fco"))
            item.setdefault("status", "completed")
        elif kind == "reasoning":
            item.setdefault("id", new_id("rs"))
        out.append(item)
    return out


def _part_text(part: Any, param: str) -> str:
    part = dict_value(part, param)
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return str_value(part.get("text"), f"{param}.text")
    if kind == "refusal":
        return str_value(part.get("refusal"), f"{param}.refusal")
    raise unsupported("Content parts", kind, f"{param}.type")


def _content(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    parts = list_value(value, param, allow_empty=True)
    return "\n".join(_part_text(p, f"{param}[{j}]") for j, p in enumerate(parts))


def chat_messages(items: list[dict[str, Any]], first_index: int) -> list[dict[str, Any]]:
    """Input items -> chat messages: consecutive function calls join the assistant message before
    them (text, then calls, as a chat assistant turn holds them). `first_index`: the place of
    items[0] in the request's `input` (negative for inherited items), for error messages."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i + first_index}]" if i + first_index >= 0 else "previous_response_id"
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": _content(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            name = str_value(item.get("name"), f"{param}.name")
            if item.get("namespace") is not None:
                name = qualified_name(str_value(item["namespace"], f"{param}.namespace"), name)
            call = {"id": str_value(item.get("call_id"), f"{param}.call_id"), "type": "function",
                    "function": {"name": name,
                                 "arguments": str_value(item.get("arguments", "{}"), f"{param}.arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "reasoning":  # an earlier turn's thinking: not part of the prompt
            list_value(item.get("summary", []), f"{param}.summary", allow_empty=True)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": str_value(item.get("call_id"), f"{param}.call_id"),
                             "content": _content(item.get("output"), f"{param}.output")})
        else:
            raise unsupported("Input items", kind, f"{param}.type")
    return messages


# ------------------------------------------------------------------ tools and formats


def qualified_name(namespace: str, name: str) -> str:
    return f"{namespace}{_NAMESPACE_JOIN}{name}"


def namespaced_names(tools: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The model's name of each function in a namespace of a request's (checked) `tools` -> (namespace, name)."""
    return {qualified_name(tool["name"], inner["name"]): (tool["name"], inner["name"])
            for tool in tools if tool.get("type") == "namespace" for inner in tool["tools"]}


def _chat_function(tool: dict[str, Any], param: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise unsupported("Tools", tool.get("type"), f"{param}.type")
    if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
        raise invalid(f"'{param}.strict' must be a boolean.", f"{param}.strict")
    function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
    if namespace is not None:
        name = str_value(tool.get("name"), f"{param}.name", allow_empty=False)
        function["name"] = qualified_name(namespace["name"], name)
        if namespace.get("description"):
            lead = f"({namespace['name']}: {namespace['description']})"
            function["description"] = f"{lead} {tool.get('description') or ''}".strip()
    return {"type": "function", "function": function}


def chat_tools(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat tools, the hosted tool types not offered): functions, and the functions of namespaces, as
    chat tools; web search left out; any other tool type refused, named."""
    tools, not_offered = [], []
    for k, tool in enumerate(list_value(value, "tools", allow_empty=True)):
        param = f"tools[{k}]"
        tool = dict_value(tool, param)
        if tool.get("type") in NOT_OFFERED_TOOLS:
            not_offered.append(tool["type"])
        elif tool.get("type") == "namespace":
            str_value(tool.get("name"), f"{param}.name", allow_empty=False)
            str_value(tool.get("description") or "", f"{param}.description")
            inner = list_value(tool.get("tools"), f"{param}.tools")
            tools += [_chat_function(dict_value(t, f"{param}.tools[{j}]"), f"{param}.tools[{j}]", tool)
                      for j, t in enumerate(inner)]
        else:
            tools.append(_chat_function(tool, param))
    names = [t["function"].get("name") for t in tools]
    if len(set(names)) < len(names):
        raise invalid("'tools' names a function twice (a namespace's functions are named NAMESPACE__NAME).", "tools")
    return tools, not_offered


def chat_tool_choice(value: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(the chat tool_choice, the tools offered to the model): `allowed_tools` narrows the tools."""
    if value is None or isinstance(value, str):
        return value, tools
    choice = dict_value(value, "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": str_value(choice.get("name"), "tool_choice.name")}}, tools
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid(f"'tool_choice.mode' must be 'auto' or 'required', got {json.dumps(mode)}.", "tool_choice.mode")
        names = set()
        for j, allowed in enumerate(list_value(choice.get("tools"), "tool_choice.tools", allow_empty=True)):
            allowed = dict_value(allowed, f"tool_choice.tools[{j}]")
            if allowed.get("type") != "function":
                raise unsupported("Tools", allowed.get("type"), f"tool_choice.tools[{j}].type")
            names.add(str_value(allowed.get("name"), f"tool_choice.tools[{j}].name"))
        known = {t["function"].get("name") for t in tools}
        if names - known:
            raise invalid(f"'tool_choice.tools' names tools not in 'tools': {', '.join(sorted(names - known))}.",
                          "tool_choice.tools")
        return mode, [t for t in tools if t["function"].get("name") in names]
    raise unsupported("Tool choices", kind, "tool_choice.type")


def response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` -> the chat `response_format` (flat json_schema -> nested)."""
    if text is None:
        return None
    fmt = dict_value(text, "text").get("format")
    if fmt is None:
        return None
    fmt = dict_value(fmt, "text.format")
    if fmt.get("type") == "json_schema":
        spec = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    metadata = dict_value(value, "metadata")
    if len(metadata) > METADATA_MAX_KEYS:
        raise invalid(f"'metadata' may hold at most {METADATA_MAX_KEYS} keys, got {len(metadata)}.", "metadata")
    for key, item in metadata.items():
        if len(key) > METADATA_MAX_KEY_CHARS:
            raise invalid(f"'metadata' keys may be at most {METADATA_MAX_KEY_CHARS} characters.", "metadata")
        if not isinstance(item, str) or len(item) > METADATA_MAX_VALUE_CHARS:
            raise invalid(f"'metadata' values must be strings of at most {METADATA_MAX_VALUE_CHARS} characters.",
                          "metadata")
    return metadata


def _include(value: Any) -> list[str]:
    include = list_value(value, "include", allow_empty=True) if value is not None else []
    for j, entry in enumerate(include):
        str_value(entry, f"include[{j}]")
    return include


# ------------------------------------------------------------------ error names

# Chat names in parse_chat's (and the engine's) errors -> the Responses field the user sent.
_RENAMES = (
    (re.compile(r"^messages(\[\d+\])?.*"), "input"),
    (re.compile(r"^tools\[(\d+)\]\.function\.(\w+)"), r"tools[\1].\2"),
    (re.compile(r"^tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^(max_completion_tokens|max_tokens)$"), "max_output_tokens"),
    (re.compile(r"^logprobs$"), "include"),
    (re.compile(r"^reasoning_effort$"), "reasoning.effort"),
)


def responses_param(param: str | None) -> str | None:
    if not param:
        return param
    for pattern, name in _RENAMES:
        if pattern.match(param):
            return pattern.sub(name, param, count=1)
    return param


def renamed(error: APIError) -> APIError:
    """The error with the Responses name of its parameter, in `param` and in its message."""
    new = responses_param(error.param)
    if new != error.param and error.param:
        error.message = error.message.replace(f"'{error.param}", f"'{new}")
        error.param = new
    return error


# ------------------------------------------------------------------ the request


def parse_responses(body: dict, request_id: str, limits: RequestLimits,
                    inherited: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    """Validate a /v1/responses body. `inherited`: the context and output of `previous_response_id`."""
    if body.get("input") is None:
        raise invalid("you must provide an input parameter.", "input")
    new_items = normalize_items(body["input"])
    context = list(inherited or []) + new_items
    instructions = body.get("instructions")
    messages = [] if instructions is None else [{"role": "system", "content": str_value(instructions, "instructions")}]
    messages += chat_messages(context, -len(inherited or []))
    include = _include(body.get("include"))
    logprobs = LOGPROBS_INCLUDE in include
    tools, not_offered = chat_tools(body["tools"]) if body.get("tools") is not None else ([], [])
    tool_choice, offered = chat_tool_choice(body.get("tool_choice"), tools)
    truncation = body.get("truncation") or "disabled"
    if truncation not in _TRUNCATION:
        raise invalid(f"'truncation' must be 'auto' or 'disabled', got {json.dumps(truncation)}.", "truncation")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise invalid("'store' must be a boolean.", "store")
    metadata = _metadata(body.get("metadata"))
    if body.get("user") is not None:
        str_value(body["user"], "user")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": body.get("stream")}
    for key in ("temperature", "top_p", "parallel_tool_calls", *_VENDOR_FIELDS):
        if body.get(key) is not None:
            chat[key] = body[key]
    if offered:
        chat["tools"] = offered
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = dict_value(body["reasoning"], "reasoning") if body.get("reasoning") is not None else {}
    if reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    if (fmt := response_format(body.get("text"))) is not None:
        chat["response_format"] = fmt
    if logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.get("top_logprobs") or 0
    elif body.get("top_logprobs") is not None:
        chat["top_logprobs"], chat["logprobs"] = body["top_logprobs"], True  # validated; not returned
    try:
        plan = parse_chat(chat, request_id, limits)
    except APIError as error:
        raise renamed(error) from None
    for generate in plan.requests:  # `auto`: the engine drops the oldest turns to fit, counting its own prompt
        generate.drop_oldest_messages = truncation == "auto"
    echo = {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": metadata or {},
        "model": body["model"],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "top_logprobs": body.get("top_logprobs", 0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "truncation": truncation,
        "user": body.get("user"),
        "store": True if store is None else store,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "background": False,
        "service_tier": "default",
    }
    return ResponsesRequest(plan, context, echo, plan.stream, echo["store"], logprobs, not_offered)
