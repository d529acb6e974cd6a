"""The Messages API's part of /openapi.json: its paths and schemas, with the ranges request.py
enforces (so the fuzzer builds meaningful requests and the document never drifts from the checks)."""

from __future__ import annotations

from typing import Any

from conduit.v1.contract import SAMPLING_RANGES

from ..limits import RequestLimits
from .request import TEMPERATURE_RANGE

_UINT32_MAX = 2**32 - 1
Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _schemas(limits: RequestLimits) -> dict[str, Schema]:
    cache_control = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["ephemeral"]}}}
    text_block = {"type": "object", "required": ["type", "text"],
                  "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"},
                                 "cache_control": cache_control, "defer_loading": {"type": "boolean"}}}
    tool_use = {"type": "object", "required": ["type", "id", "name", "input"],
                "properties": {"type": {"type": "string", "enum": ["tool_use"]}, "id": {"type": "string", "minLength": 1},
                               "name": {"type": "string", "minLength": 1}, "input": {"type": "object"}}}
    tool_result = {"type": "object", "required": ["type", "tool_use_id"],
                   "properties": {"type": {"type": "string", "enum": ["tool_result"]},
                                  "tool_use_id": {"type": "string", "minLength": 1},
                                  "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": text_block}]},
                                  "is_error": {"type": "boolean"}}}
    text_or_blocks = {"oneOf": [{"type": "string"}, {"type": "array", "items": text_block, "minItems": 1}]}
    message = {"type": "object", "required": ["role", "content"],
               "properties": {"role": {"type": "string", "enum": ["user", "assistant", "system"]},
                              "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
                                  "oneOf": [text_block, tool_use, tool_result]}}]}}}
    tool = {"type": "object", "required": ["name", "input_schema"],
            "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                           "description": {"type": "string"}, "input_schema": {"type": "object"},
                           "cache_control": cache_control, "defer_loading": {"type": "boolean"}}}
    tool_choice = {"type": "object", "required": ["type"],
                   "properties": {"type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
                                  "name": {"type": "string"}, "disable_parallel_tool_use": {"type": "boolean"}}}
    output_config = {"type": "object", "properties": {
        "format": {"type": "object", "required": ["type", "schema"],
                   "properties": {"type": {"type": "string", "enum": ["json_schema"]}, "schema": {"type": "object"}}},
        "effort": {"type": "string", "minLength": 1}}}
    top_p = SAMPLING_RANGES["top_p"]
    prompt = {
        "model": {"type": "string", "minLength": 1, "description": "a model id from GET /v1/models"},
        "messages": {"type": "array", "items": message, "minItems": 1, "maxItems": limits.max_messages,
                     "description": "the last message must be a user turn"},
        "system": text_or_blocks,
        "tools": {"type": "array", "items": tool},
        "tool_choice": tool_choice,
        "output_config": output_config,
        "thinking": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["adaptive", "enabled", "disabled"]}, "budget_tokens": {"type": "integer"}}},
    }
    request = {
        **prompt,
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": limits.max_tokens or _UINT32_MAX},
        "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": limits.max_stop},
        "temperature": {"type": "number", "minimum": TEMPERATURE_RANGE.lo, "maximum": TEMPERATURE_RANGE.hi},
        "top_p": {"type": "number", "minimum": top_p.lo, "exclusiveMinimum": True, "maximum": top_p.hi},
        "top_k": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "metadata": {"type": "object", "properties": {"user_id": {"type": "string", "nullable": True}}},
        "stream": {"type": "boolean"},
    }
    usage = {"type": "object", "properties": {name: {"type": "integer"} for name in (
        "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}}
    return {
        "MessagesRequest": {"type": "object", "required": ["model", "max_tokens", "messages"], "properties": request},
        "CountTokensRequest": {"type": "object", "required": ["model", "messages"], "properties": prompt},
        "Message": {
            "type": "object",
            "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
            "properties": {
                "id": {"type": "string"}, "type": {"type": "string", "enum": ["message"]},
                "role": {"type": "string", "enum": ["assistant"]}, "model": {"type": "string"},
                "content": {"type": "array", "items": {"type": "object"}},
                "stop_reason": {"type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
                "stop_sequence": {"type": "string", "nullable": True}, "usage": usage,
            },
        },
        "MessageTokensCount": {"type": "object", "required": ["input_tokens"],
                               "properties": {"input_tokens": {"type": "integer"}}},
        "AnthropicError": {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": {"type": "string", "enum": ["error"]},
                "error": {"type": "object", "required": ["type", "message"],
                          "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
                "request_id": {"type": "string"},
            },
        },
    }


def _errors() -> dict[str, Any]:
    reasons = {
        400: "invalid_request_error", 401: "authentication_error (x-api-key or Bearer)", 404: "not_found_error",
        413: "request_too_large", 429: "rate_limit_error: the engine's queue is full (Retry-After)",
        500: "api_error (the message names the request id)", 502: "api_error: the engine refused this server",
        504: "timeout_error", 529: "overloaded_error: the engine is unavailable or this server is shutting down",
    }
    content = {"application/json": {"schema": _ref("AnthropicError")}}
    return {str(status): {"description": what, "content": content} for status, what in reasons.items()}


def messages_openapi(limits: RequestLimits, parameters: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Schema]]:
    """(paths, component schemas); `parameters`: the header parameters every route takes."""
    version = {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"},
               "description": "accepted; Anthropic's clients send it (errors and /v1/models then take Anthropic's shape)"}

    def post(summary: str, request: str, response: str, streams: bool) -> dict[str, Any]:
        content: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
        if streams:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        return {"post": {
            "summary": summary,
            "parameters": [*parameters, version],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": {"description": "the answer" + (
                "; with stream=true events from message_start to message_stop" if streams else ""),
                "content": content}, **_errors()},
        }}

    paths = {
        "/v1/messages": post("Anthropic Messages API", "MessagesRequest", "Message", streams=True),
        "/v1/messages/count_tokens": post("Tokens of a Messages request's prompt", "CountTokensRequest",
                                          "MessageTokensCount", streams=False),
    }
    return paths, _schemas(limits)
