"""The routes every client shares, whatever API it speaks: GET /health, /metrics, /openapi.json, and
the model list (GET /v1/models and /v1/models/{id}, in Anthropic's shape to Anthropic's clients)."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response

from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from .context import ShimContext
from .messages import is_anthropic_request
from .messages.routes import model_list, model_object
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
    }


def _health_statuses(ctx: ShimContext) -> dict[str, str]:
    """Each model's status through its channels: SERVING when one of its replicas is."""
    statuses = {}
    for model_id, engines in ctx.models.clients(engine_metadata()).items():
        for engine in engines:
            try:
                statuses[model_id] = engine.health(timeout=HEALTH_TIMEOUT_S, metadata=engine_metadata())
            except ConduitError:
                statuses[model_id] = "UNREACHABLE"
            if statuses[model_id] == "SERVING":
                break
    return statuses


def register_service(app: Flask, ctx: ShimContext, document: dict[str, Any]) -> None:
    """`document` is the OpenAPI document /openapi.json serves."""

    @app.get("/health")
    def health() -> Response:
        if ctx.drain.draining:
            return json_response({"status": "draining", "engine": None}, 503)
        statuses = _health_statuses(ctx)
        worst = [s for s in statuses.values() if s != "SERVING"]
        status = worst[0] if worst else "SERVING" if statuses else "UNREACHABLE"
        ok = status == "SERVING"
        body = {"status": "ok" if ok else "unavailable", "engine": status}
        if set(statuses) != {""}:
            body["models"] = statuses
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
