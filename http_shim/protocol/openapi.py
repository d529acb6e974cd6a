"""What each API declares its share of GET /openapi.json with: an `ApiPart` of operations (routes whose
body is a typed request model), hand-kept answer schemas and bodiless path items. The document is
assembled from the parts in http_shim/openapi_document.py, which imports every API; nothing here does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .base import Schema

REF_TEMPLATE = "#/components/schemas/{model}"  # where components live, for pydantic's refs too
REQUEST_ID_HEADER: Schema = {
    "name": "X-Request-Id", "in": "header", "required": False,
    "description": "names the request in logs and in the engine; printable ASCII, at most 128 characters",
    "schema": {"type": "string"}}
_ERROR_REASONS = {
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


def ref(name: str) -> Schema:
    return {"$ref": REF_TEMPLATE.format(model=name)}


def error_responses(*statuses: int) -> dict[str, Any]:
    """OpenAI-shaped error answers (the `Error` schema) for `statuses`."""
    content = {"application/json": {"schema": ref("Error")}}
    return {str(s): {"description": _ERROR_REASONS[s], "content": content} for s in statuses}


def answers(schema: str, errors: Mapping[str, Any], description: str = "the answer", events: bool = False) -> Schema:
    """A route's answers: 200 with the component `schema` (and server-sent events, with `events`), and `errors`."""
    content: dict[str, Any] = {"application/json": {"schema": ref(schema)}}
    if events:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {"200": {"description": description, "content": content}, **errors}


@dataclass(frozen=True)
class Operation:
    """A POST route whose body is `request`, answered by the component schema `response`; `streams`
    (when set) says how its server-sent events end, and makes the answer text/event-stream too."""

    path: str
    summary: str
    request: type[BaseModel]
    response: str
    streams: str = ""
    parameters: Sequence[Schema] = (REQUEST_ID_HEADER,)
    errors: Mapping[str, Any] = field(default_factory=lambda: error_responses(*_ERROR_REASONS))  # all of them

    def path_item(self) -> dict[str, Any]:
        description = f"the answer, or with stream=true {self.streams}" if self.streams else "the answer"
        return {"post": {
            "summary": self.summary,
            "parameters": list(self.parameters),
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref(self.request.__name__)}}},
            "responses": answers(self.response, self.errors, description, events=bool(self.streams)),
        }}


@dataclass(frozen=True)
class ApiPart:
    """One API's share of the document."""

    operations: Sequence[Operation] = ()
    schemas: Mapping[str, Schema] = field(default_factory=dict)  # answers, errors: hand-kept
    paths: Mapping[str, Any] = field(default_factory=dict)  # routes with no request body
