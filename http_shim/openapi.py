"""The OpenAPI 3 document of the shim's HTTP API, served at GET /openapi.json.

Detailed enough for client generators and for a fuzzer (schemathesis, `make fuzz`) to build
meaningful requests: every field the shim reads, with the ranges it enforces (taken from the
contract and from this server's limits, so the document never drifts from the checks). Unknown
fields are accepted and ignored, as in OpenAI's API, so request objects allow extra properties.
"""

from __future__ import annotations

from typing import Any

from conduit.v1.contract import LOGIT_BIAS_RANGE, MAX_TOP_LOGPROBS, REASONING_EFFORTS, SAMPLING_RANGES

from .embeddings.openapi import embeddings_openapi
from .messages.openapi import messages_openapi
from .limits import MAX_COMPLETION_LOGPROBS, MAX_PROMPTS, RequestLimits
from .responses.openapi import responses_paths

_UINT32_MAX = 2**32 - 1

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _sampling_properties() -> dict[str, Schema]:
    properties: dict[str, Schema] = {}
    for name, allowed in SAMPLING_RANGES.items():
        schema: Schema = {"type": "number", "minimum": allowed.lo, "maximum": allowed.hi}
        if allowed.lo_open:
            schema["exclusiveMinimum"] = True
        properties[name] = _nullable(schema)
    properties["seed"] = _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1})
    properties["top_k"] = _nullable({"type": "integer", "minimum": -1, "maximum": 2**31 - 1})
    properties["logit_bias"] = _nullable(
        {
            "type": "object",
            "description": "token id (as a string) -> bias",
            "additionalProperties": {"type": "number", "minimum": LOGIT_BIAS_RANGE.lo, "maximum": LOGIT_BIAS_RANGE.hi},
            "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        }
    )
    return properties


def _common_properties(limits: RequestLimits, max_tokens_min: int) -> dict[str, Schema]:
    max_tokens: Schema = {"type": "integer", "minimum": max_tokens_min, "maximum": limits.max_tokens or _UINT32_MAX}
    stop_string = {"type": "string", "minLength": 1}
    return {
        "model": {"type": "string", "minLength": 1, "description": "a model id from GET /v1/models"},
        "max_tokens": _nullable(max_tokens),
        "n": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_n}),
        "stop": _nullable(
            {"oneOf": [stop_string, {"type": "array", "items": stop_string, "maxItems": limits.max_stop}]}
        ),
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable(
            {"type": "object", "properties": {"include_usage": _nullable({"type": "boolean"})}}
        ),
        "user": {"type": "string"},
        "min_tokens": _nullable({"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}),
        "ignore_eos": _nullable({"type": "boolean"}),
        "stop_token_ids": _nullable({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}}),
        "response_format": _nullable(_ref("ResponseFormat")),
        "structured_outputs": _nullable(_ref("StructuredOutputs")),
        **_sampling_properties(),
    }


def _message_schemas() -> dict[str, Schema]:
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    }
    content = {"oneOf": [{"type": "string"}, {"type": "array", "items": text_part, "minItems": 1}]}
    tool_call = {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}},
            },
        },
    }

    def message(role: str | list[str], required: list[str], extra: dict[str, Schema] | None = None) -> Schema:
        roles = [role] if isinstance(role, str) else role
        return {
            "type": "object",
            "required": ["role", *required],
            "properties": {"role": {"type": "string", "enum": roles}, "content": content, "name": {"type": "string"}, **(extra or {})},
        }

    return {
        "ChatMessage": {
            "oneOf": [
                message(["system", "developer", "user"], ["content"]),
                message(
                    "assistant",
                    [],
                    {"content": _nullable(content), "tool_calls": {"type": "array", "items": tool_call}},
                ),
                message("tool", ["content", "tool_call_id"], {"tool_call_id": {"type": "string", "minLength": 1}}),
            ]
        },
        "Tool": {
            "type": "object",
            "required": ["type", "function"],
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                        "description": {"type": "string"},
                        "parameters": {"type": "object", "description": "a JSON Schema"},
                    },
                },
            },
        },
        "ToolChoice": {
            "oneOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"type": "string", "enum": ["function"]},
                        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
                    },
                },
            ]
        },
        "ResponseFormat": {
            "oneOf": [
                {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["text"]}}},
                {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["json_object"]}}},
                {
                    "type": "object",
                    "required": ["type", "json_schema"],
                    "properties": {
                        "type": {"type": "string", "enum": ["json_schema"]},
                        "json_schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "schema": {"type": "object"},
                                "strict": _nullable({"type": "boolean"}),
                            },
                        },
                    },
                },
            ]
        },
        "StructuredOutputs": {
            "type": "object",
            "description": "exactly one of regex, grammar (Lark) or json (a JSON Schema)",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "regex": {"type": "string", "minLength": 1},
                "grammar": {"type": "string", "minLength": 1},
                "json": {"type": "object"},
            },
        },
    }


def _request_schemas(limits: RequestLimits) -> dict[str, Schema]:
    chat = _common_properties(limits, 1)
    chat.update(
        {
            "messages": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1, "maxItems": limits.max_messages},
            "max_completion_tokens": chat["max_tokens"],
            "logprobs": _nullable({"type": "boolean"}),
            "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}),
            "tools": _nullable({"type": "array", "items": _ref("Tool")}),
            "tool_choice": _nullable(_ref("ToolChoice")),
            "parallel_tool_calls": _nullable({"type": "boolean"}),
            "metadata": _nullable({"type": "object"}),
            "store": _nullable({"type": "boolean"}),
            # Reasoning models (docs/reasoning.md); the last two are vendor fields, as vLLM's.
            "reasoning_effort": _nullable({"type": "string", "enum": list(REASONING_EFFORTS)}),
            "chat_template_kwargs": _nullable({"type": "object"}),
            "max_reasoning_tokens": _nullable({"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}),
        }
    )
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}}
    completion = _common_properties(limits, 0)
    completion.update(
        {
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_PROMPTS},
                    token_ids,
                    {"type": "array", "items": token_ids, "minItems": 1, "maxItems": MAX_PROMPTS},
                ]
            },
            "best_of": _nullable({"type": "integer", "minimum": 1, "maximum": limits.max_n}),
            "echo": _nullable({"type": "boolean"}),
            "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS}),
            "suffix": _nullable({"type": "string", "maxLength": 0, "description": "not supported unless empty"}),
        }
    )
    return {
        "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"], "properties": chat},
        "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "properties": completion},
    }


def _response_schemas() -> dict[str, Schema]:
    counts = {n: {"type": "integer"} for n in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage = {
        "type": "object",
        "properties": {
            **counts,
            "prompt_tokens_details": {
                "type": "object",
                "properties": {"cached_tokens": {"type": "integer"}},
                "description": "cached_tokens: prompt tokens served from the engine's prefix cache",
            },
        },
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type", "param", "code"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": _nullable({"type": "string"}),
                        "code": _nullable({"type": "string"}),
                    },
                }
            },
        },
        "Model": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["model"]},
                "created": {"type": "integer"},
                "owned_by": {"type": "string"},
                "max_model_len": {"type": "integer"},
            },
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("Model")}},
        },
        "ChatCompletion": {
            "type": "object",
            "required": ["id", "object", "created", "model", "choices"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["chat.completion"]},
                "created": {"type": "integer"},
                "model": {"type": "string"},
                "choices": {"type": "array", "items": {"type": "object"}},
                "usage": usage,
            },
        },
        "Completion": {
            "type": "object",
            "required": ["id", "object", "created", "model", "choices"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string", "enum": ["text_completion"]},
                "created": {"type": "integer"},
                "model": {"type": "string"},
                "choices": {"type": "array", "items": {"type": "object"}},
                "usage": usage,
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"type": "string", "enum": ["ok", "unavailable", "draining"]}, "engine": {"type": "string"}},
        },
    }


def _error_responses(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "invalid request (the error's param names the field)",
        401: "missing or wrong API key",
        404: "unknown model or URL",
        413: "request body over the server's limit",
        429: "the engine's queue is full (Retry-After)",
        500: "internal error (the message names the request id)",
        502: "the engine refused this server's credentials (an operator's error)",
        503: "the engine is unavailable, or this server is shutting down (Retry-After)",
        504: "the request's deadline passed",
    }
    error = {"application/json": {"schema": _ref("Error")}}
    return {str(s): {"description": reasons[s], "content": error} for s in statuses}


def openapi_document(limits: RequestLimits, auth_required: bool) -> dict[str, Any]:
    request_id_header = {
        "name": "X-Request-Id",
        "in": "header",
        "required": False,
        "description": "names the request in logs and in the engine; printable ASCII, at most 128 characters",
        "schema": {"type": "string"},
    }
    generation_errors = _error_responses(400, 401, 404, 413, 429, 500, 502, 503, 504)

    def generation(summary: str, request: str, response: str) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "parameters": [request_id_header],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
                "responses": {
                    "200": {
                        "description": "the answer, or with stream=true server-sent events ending with data: [DONE]",
                        "content": {
                            "application/json": {"schema": _ref(response)},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **generation_errors,
                },
            }
        }

    document: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "Conduit OpenAI-compatible API",
            "version": "1",
            "description": "The OpenAI API subset the Conduit HTTP shim serves. Unknown request fields are ignored.",
        },
        "paths": {
            "/v1/chat/completions": generation("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
            "/v1/completions": generation("Text completion", "CompletionRequest", "Completion"),
            "/v1/models": {
                "get": {
                    "summary": "Served models",
                    "responses": {
                        "200": {"description": "the models", "content": {"application/json": {"schema": _ref("ModelList")}}},
                        **_error_responses(401, 503),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One served model",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "the model", "content": {"application/json": {"schema": _ref("Model")}}},
                        **_error_responses(401, 404, 503),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "Readiness: 200 when the engine serves, 503 when not or while draining",
                    "security": [],
                    "responses": {
                        code: {"description": what, "content": {"application/json": {"schema": _ref("Health")}}}
                        for code, what in (("200", "ready"), ("503", "not ready"))
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text exposition format)",
                    "security": [],
                    "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}},
                }
            },
        },
        "components": {"schemas": {**_message_schemas(), **_request_schemas(limits), **_response_schemas()}},
    }
    paths, schemas = responses_paths([request_id_header], _error_responses)
    document["paths"].update(paths)
    document["components"]["schemas"].update(schemas)
    messages_paths, messages_schemas = messages_openapi(limits, [request_id_header])
    document["paths"].update(messages_paths)
    document["components"]["schemas"].update(messages_schemas)
    embeddings_paths, embeddings_schemas = embeddings_openapi([request_id_header], _error_responses)
    document["paths"].update(embeddings_paths)
    document["components"]["schemas"].update(embeddings_schemas)
    if auth_required:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
