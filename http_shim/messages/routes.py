"""The Messages API's routes, and Anthropic's conventions at the edge.

Anthropic's clients are known by the route or by the `anthropic-version` header every SDK sends: their
errors take Anthropic's shape (`anthropic_error`, which the app's error handlers call), their responses
carry a `request-id` header, and GET /v1/models answers in Anthropic's list shape (`model_list`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from flask import Flask, Response, request

from conduit.v1 import engine_pb2 as pb

from ..context import ShimContext
from ..errors import APIError
from ..models import RPC_TIMEOUT_S
from ..web import engine_metadata, json_response, read_body, request_id
from .errors import anthropic_status, error_body
from .events import MessagesEvents, new_message_id
from .request import parse_count_tokens, parse_messages

GENERATION_ROUTES = ("/v1/messages",)  # admitted (or refused) by the drain


def is_anthropic_request() -> bool:
    return request.path.startswith("/v1/messages") or "anthropic-version" in request.headers


def anthropic_error(error: APIError, request_id: str) -> Response:
    return json_response(error_body(error, request_id), anthropic_status(error.status), error.headers)


def model_object(info: pb.ModelInfo, started: int) -> dict[str, Any]:
    created = datetime.fromtimestamp(info.created or started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": info.id, "display_name": info.id, "created_at": created}


def model_list(infos: Sequence[pb.ModelInfo], started: int) -> dict[str, Any]:
    data = [model_object(info, started) for info in infos]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def register_messages(app: Flask, ctx: ShimContext) -> None:

    @app.after_request
    def add_request_id(response: Response) -> Response:
        if is_anthropic_request():
            response.headers["request-id"] = request_id()
        return response

    @app.post("/v1/messages")
    def messages() -> Response:
        plan = parse_messages(read_body(), request_id(), ctx.limits)
        model, stream = ctx.relay.open(plan.model, [plan.request])
        writer = MessagesEvents(new_message_id(), model, plan.stop_sequences)
        if plan.stream:
            return ctx.relay.sse(stream, writer)
        if not ctx.relay.collect(stream, writer.on_response):
            return Response(status=499)
        writer.finish()  # the same events a stream gets, whole
        return json_response(writer.final)

    @app.post("/v1/messages/count_tokens")
    def count_tokens() -> Response:
        tokenize = parse_count_tokens(read_body(), ctx.limits)
        calls = engine_metadata()
        info, engine = ctx.models.route(tokenize.model, metadata=calls)
        tokenize.model = info.id
        answer = engine.tokenize(request=tokenize, timeout=RPC_TIMEOUT_S, metadata=calls)
        return json_response({"input_tokens": len(answer.token_ids)})
