"""The Flask app: OpenAI routes over the engine's gRPC API.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/models/{id},
GET /health. Errors always come back as OpenAI error JSON (see errors.py).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from clients.engine_client import EngineClient
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from . import sse
from .connection import client_gone
from .engine_stream import IDLE, EngineStream
from .errors import APIError, from_engine_error
from .models import ServedModels
from .openai_to_proto import GenerationPlan, parse_chat, parse_completion, check_body
from .proto_to_openai import (
    ChatStreamTranslator,
    Collector,
    CompletionStreamTranslator,
    chat_response,
    completion_response,
)

log = logging.getLogger("http_shim")

# /health must answer a probe quickly, also when the engine does not.
HEALTH_TIMEOUT_S = 2.0


@dataclass
class ShimConfig:
    engine: str = "127.0.0.1:50051"
    # Seconds of silence on a stream before an SSE comment is written (and a departed client noticed).
    heartbeat_s: float = 5.0
    # gRPC deadline of each Generate call; None waits as long as the engine works.
    request_timeout_s: float | None = None
    # When set, requests to /v1 need "Authorization: Bearer <api_key>".
    api_key: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, headers, mimetype="application/json")


def _error(error: APIError) -> Response:
    return _json(error.body(), error.status, error.headers)


def _body() -> dict:
    try:
        body = json.loads(request.get_data())
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise APIError(
            400, "We could not parse the JSON body of your request.", "invalid_request_error", None, "invalid_json"
        ) from None
    return check_body(body)


def _model_object(info: pb.ModelInfo, started: int) -> dict[str, Any]:
    return {
        "id": info.id,
        "object": "model",
        "created": info.created or started,
        "owned_by": "conduit",
        "max_model_len": info.max_context_length,
    }


def create_app(config: ShimConfig, client: EngineClient | None = None) -> Flask:
    app = Flask("http_shim")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    engine = client or EngineClient(config.engine)
    models = ServedModels(engine)
    started = int(time.time())

    @app.errorhandler(APIError)
    def on_api_error(error: APIError) -> Response:
        if error.param == "response_format":  # the engine says "constraint": name the field the user sent
            body = request.get_json(silent=True)
            if isinstance(body, dict) and "structured_outputs" in body:
                error.param = "structured_outputs"
        return _error(error)

    @app.errorhandler(ConduitError)
    def on_engine_error(error: ConduitError) -> Response:
        return on_api_error(from_engine_error(error))

    @app.errorhandler(HTTPException)
    def on_http_error(error: HTTPException) -> Response:
        messages = {
            404: (f"Unknown request URL: {request.method} {request.path}.", "unknown_url"),
            405: (f"Method {request.method} is not allowed for {request.path}.", "method_not_allowed"),
            413: (f"The request body is larger than {config.max_body_bytes} bytes.", "request_too_large"),
        }
        message, code = messages.get(error.code or 400, (error.description or error.name, None))
        headers = {"Allow": ", ".join(error.valid_methods)} if getattr(error, "valid_methods", None) else None
        return _json(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
            error.code or 400,
            headers,
        )

    @app.errorhandler(Exception)
    def on_bug(error: Exception) -> Response:
        log.exception("internal error")
        return _error(APIError(500, "The server had an internal error.", "server_error", None, "internal_error"))

    @app.before_request
    def check_api_key() -> Response | None:
        if config.api_key is None or not request.path.startswith("/v1"):
            return None
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
            return None
        return _error(APIError(401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"))

    @app.get("/health")
    def health() -> Response:
        try:
            status = engine.health(timeout=HEALTH_TIMEOUT_S)  # SERVING, NOT_SERVING, ...
        except ConduitError:
            status = "UNREACHABLE"
        ok = status == "SERVING"
        return _json({"status": "ok" if ok else "unavailable", "engine": status}, 200 if ok else 503)

    @app.get("/v1/models")
    def list_models() -> Response:
        return _json({"object": "list", "data": [_model_object(m, started) for m in models.list()]})

    @app.get("/v1/models/<path:model_id>")
    def get_model(model_id: str) -> Response:
        return _json(_model_object(models.info(model_id), started))

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        plan = parse_chat(_body(), response_id)
        return _generate(plan, response_id, ChatStreamTranslator, chat_response)

    @app.post("/v1/completions")
    def completions() -> Response:
        response_id = f"cmpl-{uuid.uuid4().hex}"
        plan = parse_completion(_body(), response_id)
        return _generate(plan, response_id, CompletionStreamTranslator, completion_response)

    def _generate(
        plan: GenerationPlan,
        response_id: str,
        translator_class: type[ChatStreamTranslator] | type[CompletionStreamTranslator],
        build: Callable[[str, int, str, GenerationPlan, Collector], dict[str, Any]],
    ) -> Response:
        model = models.resolve(plan.model).id
        created = int(time.time())
        environ = request.environ
        stream = EngineStream(engine, plan.requests, config.request_timeout_s)
        headers = {"X-Request-Id": response_id}
        if plan.stream:
            # Wait briefly for the engine's first answer so early failures (bad argument, queue
            # full) still get a real HTTP status rather than an error event inside a 200.
            try:
                first = stream.next(config.heartbeat_s)
                translator = translator_class(response_id, created, model, plan)
                body = _sse_body(stream, first, translator, environ, config.heartbeat_s)
                response = Response(body, 200, {**sse.HEADERS, **headers}, content_type=sse.CONTENT_TYPE)
            except BaseException:
                stream.cancel()
                raise
            # Also when the body was never iterated (its finally clause then never runs).
            response.call_on_close(stream.cancel)
            return response
        collected = Collector()
        next_check = time.monotonic() + config.heartbeat_s
        try:
            while (item := stream.next(config.heartbeat_s)) is not None:
                # Check the client on every idle wait and, while tokens flow, at least once a
                # heartbeat interval: a client that gave up must not leave generation running.
                if item is IDLE or time.monotonic() >= next_check:
                    next_check = time.monotonic() + config.heartbeat_s
                    if client_gone(environ):
                        log.info("%s: client left before the answer; cancelled", response_id)
                        return Response(status=499)
                if item is not IDLE:
                    collected.add(*item)
        finally:
            stream.cancel()
        return _json(build(response_id, created, model, plan, collected), 200, headers)

    return app


def _sse_body(
    stream: EngineStream,
    first: Any,
    translator: ChatStreamTranslator | CompletionStreamTranslator,
    environ: dict[str, Any],
    heartbeat_s: float,
) -> Iterator[bytes]:
    """The SSE stream. The finally clause runs when the client leaves (the failed write closes
    this generator), and cancels the engine call so generation stops."""
    last_write = time.monotonic()
    try:
        item = first
        while item is not None:
            events = [] if item is IDLE else [sse.event(c) for c in translator.on_response(*item)]
            if not events and time.monotonic() - last_write >= heartbeat_s:
                if client_gone(environ):
                    return
                events = [sse.HEARTBEAT]
            for data in events:
                yield data
                last_write = time.monotonic()
            item = stream.next(heartbeat_s)
        for chunk in translator.finish():
            yield sse.event(chunk)
        yield sse.DONE
    except APIError as error:
        yield sse.event(error.body())
        yield sse.DONE
    except Exception:
        log.exception("internal error while streaming")
        yield sse.event(
            APIError(500, "The server had an internal error.", "server_error", None, "internal_error").body()
        )
        yield sse.DONE
    finally:
        stream.cancel()
