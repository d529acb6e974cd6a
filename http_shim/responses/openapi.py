"""The Responses API's part of /openapi.json (paths and schemas), merged in by http_shim/openapi.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conduit.v1.contract import MAX_TOP_LOGPROBS

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _schemas() -> dict[str, Schema]:
    item = {"type": "object", "description": "a message (role, content: string or input_text/output_text parts), "
            "function_call, function_call_output, or an output item replayed verbatim",
            "properties": {"type": {"type": "string"}, "role": {"type": "string"}}}
    function = {"type": "object", "required": ["type", "name"], "properties": {
        "type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"},
        "description": {"type": "string"}, "parameters": {"type": "object"}, "strict": {"type": "boolean"}}}
    request = {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": item}]},
            "instructions": {"type": "string", "nullable": True},
            "previous_response_id": {"type": "string", "nullable": True},
            "store": {"type": "boolean", "default": True},
            "stream": {"type": "boolean", "default": False},
            "tools": {"type": "array", "items": {"oneOf": [function, {
                "type": "object", "required": ["type", "name", "tools"], "description": "offered as NAMESPACE__NAME",
                "properties": {"type": {"type": "string", "enum": ["namespace"]}, "name": {"type": "string"},
                               "description": {"type": "string"}, "tools": {"type": "array", "items": function}}}, {
                "type": "object", "required": ["type"], "description": "accepted, not offered to the model",
                "properties": {"type": {"type": "string", "enum": ["web_search", "web_search_preview"]}}}]}},
            "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]},
            "parallel_tool_calls": {"type": "boolean"},
            "text": {"type": "object", "properties": {"format": {"type": "object"}}},
            "max_output_tokens": {"type": "integer", "minimum": 1, "nullable": True},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
            "top_p": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 1, "nullable": True},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS, "nullable": True},
            "include": {"type": "array", "items": {"type": "string"}},
            "metadata": {"type": "object", "maxProperties": 16,
                         "additionalProperties": {"type": "string", "maxLength": 512}},
            "truncation": {"type": "string", "enum": ["disabled", "auto"]},
            "user": {"type": "string"},
        },
    }
    response = {
        "type": "object",
        "required": ["id", "object", "created_at", "status", "output", "model"],
        "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]},
            "created_at": {"type": "integer"},
            "status": {"type": "string", "enum": ["completed", "incomplete", "failed", "cancelled", "in_progress"]},
            "output": {"type": "array", "items": {"type": "object"}}, "model": {"type": "string"},
            "usage": {"type": "object", "nullable": True},
        },
    }
    items = {"type": "object", "properties": {"object": {"type": "string"}, "data": {"type": "array", "items": item},
                                              "has_more": {"type": "boolean"}}}
    return {"ResponseRequest": request, "Response": response, "ResponseInputItems": items}


def responses_paths(parameters: list[Schema], errors: Callable[..., dict[str, Any]]) -> tuple[dict, dict]:
    """(paths, schemas). `parameters`: the header parameters of every generation route; `errors(*statuses)`
    the error responses."""
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}

    def answer(description: str, schema: str, events: bool = False) -> dict[str, Any]:
        content: dict[str, Any] = {"application/json": {"schema": _ref(schema)}}
        if events:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        return {"200": {"description": description, "content": content}}

    paths = {
        "/v1/responses": {"post": {
            "summary": "Create a response (OpenAI Responses API)",
            "parameters": parameters,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ResponseRequest")}}},
            "responses": {**answer("the response, or with stream=true its events (event: = data.type)", "Response",
                                   events=True),
                          **errors(400, 401, 404, 413, 429, 500, 502, 503, 504)},
        }},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored (or running) response; stream=true replays its events",
                    "parameters": [response_id, {"name": "stream", "in": "query", "schema": {"type": "boolean"}}],
                    "responses": {**answer("the response", "Response", events=True), **errors(400, 401, 404)}},
            "delete": {"summary": "Delete a stored response", "parameters": [response_id],
                       "responses": {"200": {"description": "deleted"}, **errors(401, 404)}},
        },
        "/v1/responses/{response_id}/input_items": {"get": {
            "summary": "The input items a stored response was generated from (inherited ones included)",
            "parameters": [response_id,
                           {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                           {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                           {"name": "after", "in": "query", "schema": {"type": "string"}}],
            "responses": {**answer("a page of items", "ResponseInputItems"), **errors(400, 401, 404)}}},
        "/v1/responses/{response_id}/cancel": {"post": {
            "summary": "Cancel a response in flight on this server (400 once it finished)",
            "parameters": [response_id],
            "responses": {**answer("the cancelled response", "Response"), **errors(400, 401, 404)}}},
    }
    return paths, _schemas()
