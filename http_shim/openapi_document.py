"""GET /openapi.json, generated: the `ApiPart` each API declares (protocol/openapi.py) assembled into one
document. The request schemas are the models' own, turned into OpenAPI 3.0, with this server's caps written
in, so the document never drifts from the checks. Only the app imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .batches.protocol import BATCHES_API
from .embeddings.protocol import EMBEDDINGS_API
from .files.protocol import FILES_API
from .retrieval.protocol import RETRIEVAL_API, RETRIEVAL_BODILESS
from .limits import RequestLimits
from .messages.protocol import MESSAGES_API
from .openai.protocol import OPENAI_API
from .protocol.base import Schema
from .protocol.openapi import REF_TEMPLATE
from .responses.protocol import RESPONSES_API
from .service import SERVICE_API


def openapi_document(limits: RequestLimits, auth_required: bool) -> dict[str, Any]:
    parts = [OPENAI_API, RESPONSES_API, MESSAGES_API, EMBEDDINGS_API, FILES_API, RETRIEVAL_API, BATCHES_API,
             SERVICE_API]
    paths: dict[str, Any] = {}

    schemas: dict[str, Schema] = {}
    for part in parts:
        paths.update({op.path: op.path_item() for op in part.operations})
        for path, item in part.paths.items():  # beside an operation's post on the same path
            paths[path] = {**paths.get(path, {}), **item}
        schemas.update(part.schemas)
    for path, item in RETRIEVAL_BODILESS.items():  # beside the operations' post on the same paths
        paths[path] = {**paths.get(path, {}), **item}
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
    _, defs = models_json_schema([(m, "validation") for m in dict.fromkeys(models)], ref_template=REF_TEMPLATE)
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
