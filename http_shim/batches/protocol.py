"""The Batch API's inputs, typed (validation and their part of /openapi.json): create and list. The
answer is OpenAI's `batch` object (the openai SDK's `types.batch.Batch`), built in store.py."""

from __future__ import annotations

from ..files.protocol import EXPIRES_MAX_S, EXPIRES_MIN_S
from ..protocol.base import ApiModel, NonEmptyStr, Str, int_in, one_of
from ..protocol.metadata import Metadata
from ..protocol.openapi import ApiPart, Operation, answers, error_responses, ref

BATCHES_ROUTE = "/v1/batches"
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
COMPLETION_WINDOW_S = 24 * 3600  # "24h", the only window OpenAI offers


class OutputExpiresAfter(ApiModel):
    anchor: one_of("created_at")
    seconds: int_in(EXPIRES_MIN_S, EXPIRES_MAX_S)


class BatchCreate(ApiModel):
    """POST /v1/batches."""

    input_file_id: NonEmptyStr
    endpoint: one_of(*ENDPOINTS)
    completion_window: one_of("24h")
    metadata: Metadata | None = None
    output_expires_after: OutputExpiresAfter | None = None  # of the output and error files


class BatchListQuery(ApiModel):
    after: Str | None = None
    limit: int_in(1, 100) = 20


_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
_TIMESTAMP = {"type": "integer", "nullable": True}
_STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
_BATCH_OBJECT = {
    "type": "object",
    "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status", "created_at"],
    "properties": {
        "id": {"type": "string"}, "object": {"type": "string", "enum": ["batch"]}, "endpoint": {"type": "string"},
        "input_file_id": {"type": "string"}, "completion_window": {"type": "string"},
        "status": {"type": "string", "enum": _STATUSES},
        "output_file_id": {"type": "string", "nullable": True}, "error_file_id": {"type": "string", "nullable": True},
        "errors": {"type": "object", "nullable": True, "properties": {
            "object": {"type": "string"}, "data": {"type": "array", "items": {"type": "object", "properties": {
                "code": {"type": "string"}, "message": {"type": "string"},
                "param": {"type": "string", "nullable": True}, "line": {"type": "integer", "nullable": True}}}}}},
        **{f"{name}_at": _TIMESTAMP for name in ("created", "in_progress", "finalizing", "completed", "failed",
                                                 "expired", "expires", "cancelling", "cancelled")},
        "request_counts": {"type": "object", "properties": {k: {"type": "integer"}
                                                            for k in ("total", "completed", "failed")}},
        "usage": {"type": "object", "nullable": True},
        "metadata": {"type": "object", "nullable": True, "additionalProperties": {"type": "string"}},
        "model": {"type": "string", "nullable": True},
    },
}

BATCHES_API = ApiPart(
    operations=[Operation(BATCHES_ROUTE, "Create a batch over an uploaded JSONL file (purpose batch)", BatchCreate,
                          "Batch", parameters=(), errors=error_responses(400, 401, 404))],
    paths={
        BATCHES_ROUTE: {"get": {"summary": "This key's batches, newest first",
                                "parameters": [{"name": n, "in": "query", "schema": {"type": "string"}}
                                               for n in ("after", "limit")],
                                "responses": answers("BatchList", error_responses(400, 401))}},
        f"{BATCHES_ROUTE}/{{batch_id}}": {"get": {"summary": "A batch", "parameters": [_BATCH_ID],
                                                  "responses": answers("Batch", error_responses(401, 404))}},
        f"{BATCHES_ROUTE}/{{batch_id}}/cancel": {"post": {
            "summary": "Cancel a batch: no new line starts; it ends cancelled with its partial output",
            "parameters": [_BATCH_ID], "responses": answers("Batch", error_responses(400, 401, 404))}},
    },
    schemas={"Batch": _BATCH_OBJECT,
             "BatchList": {"type": "object", "properties": {"object": {"type": "string"},
                                                            "data": {"type": "array", "items": ref("Batch")},
                                                            "first_id": {"type": "string", "nullable": True},
                                                            "last_id": {"type": "string", "nullable": True},
                                                            "has_more": {"type": "boolean"}}}},
)
