"""GET /openapi.json, generated: each API declares its routes as an `ApiPart` (operations whose body is a
typed request model, hand-kept answer schemas, bodiless path items); `openapi_document` assembles them.
The request schemas are the models' own, turned into OpenAPI 3.0, with this server's caps written in, so
the document never drifts from the checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..limits import RequestLimits
from .base import Schema

_REF = "#/components/schemas/{model}"
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
    return {"$ref": _REF.format(model=name)}


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


def openapi_document(limits: RequestLimits, auth_required: bool) -> dict[str, Any]:
    # Imported here, not at module level, so the API packages may import this module.
    from ..embeddings.protocol import EMBEDDINGS_API
    from ..messages.protocol import MESSAGES_API
    from ..openai.protocol import OPENAI_API
    from ..responses.protocol import RESPONSES_API
    from ..service import SERVICE_API

    parts = [OPENAI_API, RESPONSES_API, MESSAGES_API, EMBEDDINGS_API, SERVICE_API]
    paths: dict[str, Any] = {}

    schemas: dict[str, Schema] = {}
    for part in parts:
        paths.update({op.path: op.path_item() for op in part.operations})
        paths.update(part.paths)
        schemas.update(part.schemas)
    schemas.update(request_schemas([op.request for part in parts for op in part.operations], limits))
    info = {"title": "Conduit OpenAI-compatible API", "version": "1",
            "description": "The OpenAI API subset the Conduit HTTP shim serves. Unknown request fields are ignored."}
    document: dict[str, Any] = {"openapi": "3.0.3", "info": info, "paths": paths, "components": {"schemas": schemas}}
    if auth_required:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document


def request_schemas(models: Iterable[type[BaseModel]], limits: RequestLimits) -> dict[str, Schema]:
    """The models' schemas (and those they refer to) by name, as OpenAPI 3.0, with `limits` written in."""
    _, defs = models_json_schema([(m, "validation") for m in dict.fromkeys(models)], ref_template=_REF)
    return {name: _openapi30(schema, limits) for name, schema in defs.get("$defs", {}).items()}


def _openapi30(schema: Any, limits: RequestLimits) -> Any:
    """JSON Schema 2020-12 (pydantic's) -> OpenAPI 3.0: a null member of anyOf becomes `nullable`; titles
    and null defaults go; an `x-cap` becomes its keyword with the operator's value."""
    if isinstance(schema, list):
        return [_openapi30(s, limits) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _openapi30(v, limits) for k, v in schema.items()
           if k not in ("title", "x-cap") and not (k == "default" and v is None)}
    if isinstance(schema.get("properties"), dict):  # names there are fields, not keywords
        out["properties"] = {name: _openapi30(v, limits) for name, v in schema["properties"].items()}
    if "x-cap" in schema:
        limit, keyword = schema["x-cap"]
        value = getattr(limits, limit)
        if value is not None:
            out[keyword] = value

    members = out.get("anyOf")
    if members and {"type": "null"} in members:
        rest = [m for m in members if m != {"type": "null"}]
        del out["anyOf"]
        out.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        out["nullable"] = True
    return out
