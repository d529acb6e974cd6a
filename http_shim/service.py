"""The routes every client shares, whatever API it speaks: GET /health, /metrics, /openapi.json, and
the model list (GET /v1/models and /v1/models/{id}, in Anthropic's shape to Anthropic's clients)."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response

from clients.engine_client import EngineClient
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .context import ShimContext
from .messages import is_anthropic_request
from .messages.routes import model_list, model_object
from .protocol.openapi import ApiPart, error_responses, ref
from .routing import RoutedEngine
from .web import engine_metadata, json_response

# /health must answer a probe quickly, also when the engine does not.
HEALTH_TIMEOUT_S = 2.0


def _model_object(info: pb.ModelInfo, started: int) -> dict[str, Any]:
    return {
        "id": info.id,
        "object": "model",
        "created": info.created or started,
        "owned_by": "conduit",
        "max_model_len": info.max_context_length,
        # vLLM's: a LoRA adapter's base model and folder (gateways find adapters by `parent`).
        "root": info.source,
        "parent": info.parent or None,
    }


def _health(engine: EngineClient | RoutedEngine) -> str:
    """A model's status through its engine client (over replicas: SERVING when one of them is)."""
    try:
        return engine.health(timeout=HEALTH_TIMEOUT_S, metadata=engine_metadata())
    except ConduitError:
        return "UNREACHABLE"


def register_service(app: Flask, ctx: ShimContext, document: dict[str, Any]) -> None:
    """`document` is the OpenAPI document /openapi.json serves."""

    @app.get("/health")
    def health() -> Response:
        """Readiness (docs/operations.md): every engine has said what it serves, so /v1/models is whole, and
        every model listed has an engine serving it now. The first reason it is not is `engine`."""
        if ctx.drain.draining:
            return json_response({"status": "draining", "engine": None}, 503)
        statuses = {model_id: _health(engine) for model_id, engine in ctx.models.clients(engine_metadata()).items()}
        engines = ctx.models.engine_states()  # read after clients(), whose listing may have just heard from one
        waiting = [engines.get(address, "UNREACHABLE") for address in ctx.models.unlisted()]
        worst = [s for s in (*waiting, *statuses.values()) if s != "SERVING"]
        status = worst[0] if worst else "UNREACHABLE" if waiting or not statuses else "SERVING"
        ok = status == "SERVING"
        body: dict[str, Any] = {"status": "ok" if ok else "unavailable", "engine": status}
        if set(statuses) != {""}:
            body["models"] = statuses
        if engines:
            body["engines"] = engines
        return json_response(body, 200 if ok else 503)

    @app.get("/metrics")
    def metrics_text() -> Response:
        body, content_type = ctx.metrics.exposition()
        return Response(body, 200, content_type=content_type)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return json_response(document)

    @app.get("/v1/models")
    def list_models() -> Response:
        infos = ctx.models.list(metadata=engine_metadata())
        if is_anthropic_request():
            return json_response(model_list(infos, ctx.started))
        return json_response({"object": "list", "data": [_model_object(m, ctx.started) for m in infos]})

    @app.get("/v1/models/<path:model_id>")
    def get_model(model_id: str) -> Response:
        info = ctx.models.info(model_id, metadata=engine_metadata())
        if is_anthropic_request():
            return json_response(model_object(info, ctx.started))
        return json_response(_model_object(info, ctx.started))


def _get(summary: str, schema: str, *errors: int, **extra: Any) -> dict[str, Any]:
    answer = {"description": summary.lower(), "content": {"application/json": {"schema": ref(schema)}}}
    return {"get": {"summary": summary, **extra, "responses": {"200": answer, **error_responses(*errors)}}}


_NULLABLE_STRING = {"type": "string", "nullable": True}
SERVICE_API = ApiPart(
    paths={
        "/v1/models": _get("Served models", "ModelList", 401, 503),
        "/v1/models/{model}": _get("One served model", "Model", 401, 404, 503, parameters=[
            {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]),
        "/health": {"get": {
            "summary": "Readiness: 200 when every engine has said what it serves and every model has one serving "
                       "it, 503 when not or while draining",
            "security": [],
            "responses": {code: {"description": what, "content": {"application/json": {"schema": ref("Health")}}}
                          for code, what in (("200", "ready"), ("503", "not ready"))},
        }},
        "/metrics": {"get": {
            "summary": "Prometheus metrics (text exposition format)",
            "security": [],
            "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}},
        }},
    },
    schemas={
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": _NULLABLE_STRING, "code": _NULLABLE_STRING}}}},
        "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]}, "created": {"type": "integer"},
            "owned_by": {"type": "string"}, "max_model_len": {"type": "integer"}, "root": {"type": "string"},
            "parent": {"type": ["string", "null"], "description": "a LoRA adapter's base model; null for a base"}}},
        "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
            "object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": ref("Model")}}},
        "Health": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["ok", "unavailable", "draining"]}, "engine": {"type": "string"},
            "models": {"type": "object", "additionalProperties": {"type": "string"}},  # several engines: by model
            "engines": {"type": "object", "additionalProperties": {"type": "string"}}}},  # and by address
    },
)
