"""The Flask app: OpenAI routes over the engine's gRPC API.

Routes: POST /v1/chat/completions, POST /v1/completions, the Responses API (/v1/responses...:
responses/), Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens: messages/),
POST /v1/embeddings, POST /tokenize and POST /detokenize (embeddings/),
GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics, GET /openapi.json, and the browser
playground at / (playground.py). Errors come back as OpenAI error JSON (see errors.py), or in
Anthropic's shape to Anthropic's clients (messages/routes.py). `create_app` returns the WSGI app to
serve: the Flask app inside the middleware that stamps request ids and records metrics
(observe.py); its `state` holds the drain and the metrics.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from clients.engine_client import EngineClient
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

from .auth import KeyChecker
from .connection import ABANDON_BODY_KEY, READ_DONE_KEY, request_timeout_error
from .cors import CorsPolicy, install_cors
from .drain import Drain
from .embeddings import register_embeddings
from .errors import APIError, from_engine_error, internal_error_message
from .messages import is_anthropic_request, register_messages
from .messages.routes import GENERATION_ROUTES as MESSAGES_ROUTES
from .messages.routes import anthropic_error, model_list, model_object
from .metrics import ShimMetrics
from .models import Connect, ServedModels
from .observe import REQUEST_ID_KEY, ROUTE_KEY, ObservedApp
from .openai_to_proto import DEFAULT_LIMITS, GenerationPlan, RequestLimits, check_body, parse_chat, parse_completion
from .openapi import openapi_document
from .playground import playground
from .proto_to_openai import (ChatStreamTranslator, CompletionStreamTranslator, OpenAIEvents, chat_response,
                              completion_response)
from .relay import Relay
from .responses import RESPONSES_ROUTE, ResponseStore, StoreLimits, default_store_dir, register_responses
from .routing import RoutingConfig
from .stream_fold import Collector

log = logging.getLogger("http_shim")

# /health must answer a probe quickly, also when the engine does not.
HEALTH_TIMEOUT_S = 2.0
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# The shim's channel retries a lost engine at least this often (gRPC's default backoff grows to
# two minutes), so it serves again within seconds of the engine's return.
ENGINE_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
_GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", RESPONSES_ROUTE, *MESSAGES_ROUTES)


@dataclass
class ShimConfig:
    # One address, a gRPC URI (dns:///engine:50051), or several addresses: replicas and/or other models.
    engine: str | Sequence[str] = "127.0.0.1:50051"
    # Seconds of silence on a stream before an SSE comment is written (and a departed client noticed).
    heartbeat_s: float = 5.0
    # gRPC deadline of each Generate call; None waits as long as the engine works.
    request_timeout_s: float | None = None
    # When any is set, requests to /v1 need "Authorization: Bearer <one of them>".
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    limits: RequestLimits = DEFAULT_LIMITS
    # Origins whose web pages may call the API from a browser (none: CORS off).
    cors: CorsPolicy = CorsPolicy()
    # The Responses API's store (responses/store.py): its folder (None: default_store_dir(); "": no
    # store, nothing is kept; ":memory:": this process only) and bounds.
    responses_store_dir: str | None = None
    responses_store_limits: StoreLimits = StoreLimits()
    # How calls are spread over several engine replicas of a model (routing/).
    routing: RoutingConfig = RoutingConfig()


@dataclass
class ShimState:
    """What the server around the app needs: the drain (signals) and the metrics."""

    drain: Drain
    metrics: ShimMetrics


def connect_engine(target: str | Sequence[str], server_name: str | None = None) -> EngineClient:
    """An engine client (and channel) to one target or a set of replicas, plaintext (so
    `server_name`, a TLS certificate's name, plays no part)."""
    return EngineClient(target, options=ENGINE_CHANNEL_OPTIONS)


def _request_id() -> str:
    return request.environ.get(REQUEST_ID_KEY, "")


def _metadata() -> list[tuple[str, str]]:
    """gRPC metadata of every engine call: the HTTP request's id."""
    return [(REQUEST_ID_METADATA_KEY, _request_id())]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, headers, mimetype="application/json")


def _error(error: APIError) -> Response:
    """In the shape the client's API uses: OpenAI's, or Anthropic's (its routes, its SDKs)."""
    if is_anthropic_request():
        return anthropic_error(error, _request_id())
    return _json(error.body(), error.status, error.headers)


def _read_body(limit: int) -> bytes:
    """The request body, refused (413) past `limit` bytes whether Content-Length announced it or
    not: werkzeug's own reader silently truncates a chunked body at the limit."""
    length = request.content_length
    if length is not None and length > limit:
        raise RequestEntityTooLarge()
    stream = request.environ["wsgi.input"]  # gevent's: ends at Content-Length, or at a chunked body's end
    data = bytearray()
    try:
        while piece := stream.read(min(64 * 1024, limit + 1 - len(data))):
            data += piece
            if len(data) > limit:
                raise RequestEntityTooLarge()
    except TimeoutError:  # the server's read timeout (connection.py): a body sent too slowly
        request.environ[ABANDON_BODY_KEY] = True
        raise request_timeout_error() from None
    request.environ.get(READ_DONE_KEY, lambda: None)()
    return bytes(data)


def _body() -> dict:
    try:
        body = json.loads(_read_body(current_app.config["MAX_CONTENT_LENGTH"]))
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise APIError(
            400, "We could not parse the JSON body of your request.", "invalid_request_error", None, "invalid_json"
        ) from None
    g.body = check_body(body)
    return g.body


def _model_object(info: pb.ModelInfo, started: int) -> dict[str, Any]:
    return {
        "id": info.id,
        "object": "model",
        "created": info.created or started,
        "owned_by": "conduit",
        "max_model_len": info.max_context_length,
    }


def create_app(config: ShimConfig, connect: Connect = connect_engine) -> ObservedApp:
    """`connect` makes the engine clients (one per engine address: see models.py), e.g. with credentials."""
    app = Flask("http_shim")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    install_cors(app, config.cors)  # first: a preflight is answered before keys are asked for
    app.register_blueprint(playground)
    metrics = ShimMetrics()
    models = ServedModels(config.engine, connect, config.routing, metrics)
    started = int(time.time())
    drain = Drain(metrics)
    keys = KeyChecker(config.api_keys)
    document = openapi_document(config.limits, keys.enabled)
    relay = Relay(models, drain, metrics, config.heartbeat_s, config.request_timeout_s, _metadata)
    store_dir = default_store_dir() if config.responses_store_dir is None else config.responses_store_dir
    store = ResponseStore(store_dir, config.responses_store_limits) if store_dir else None
    register_responses(app, relay, store, config.limits, _body, _request_id, _json)

    @app.errorhandler(APIError)
    def on_api_error(error: APIError) -> Response:
        if error.code == "model_not_found" and request.path in _GENERATION_ROUTES:
            models.expire()  # the engine may have been renamed since the list was read
        if error.param == "response_format":  # the engine says "constraint": name the field the user sent
            body = g.get("body")  # the parsed request body, when it was read
            if isinstance(body, dict) and "structured_outputs" in body:
                error.param = "structured_outputs"
        return _error(error)

    @app.errorhandler(ConduitError)
    def on_engine_error(error: ConduitError) -> Response:
        return on_api_error(from_engine_error(error, _request_id()))

    @app.errorhandler(HTTPException)
    def on_http_error(error: HTTPException) -> Response:
        messages = {
            404: (f"Unknown request URL: {request.method} {request.path}.", "unknown_url"),
            405: (f"Method {request.method} is not allowed for {request.path}.", "method_not_allowed"),
            413: (f"The request body is larger than {config.max_body_bytes} bytes.", "request_too_large"),
        }
        message, code = messages.get(error.code or 400, (error.description or error.name, None))
        headers = {"Allow": ", ".join(error.valid_methods)} if getattr(error, "valid_methods", None) else {}
        if error.code == 413:  # the rest of the body is not read: this connection cannot carry another request
            request.environ[ABANDON_BODY_KEY] = True
            headers["Connection"] = "close"
        return _error(APIError(error.code or 400, message, "invalid_request_error", None, code, headers))

    @app.errorhandler(Exception)
    def on_bug(error: Exception) -> Response:
        log.exception("internal error")
        message = internal_error_message("The server had an internal error.", _request_id())
        return _error(APIError(500, message, "server_error", None, "internal_error"))

    @app.before_request
    def note_route() -> None:
        # For metrics: the rule, not the path, so label values stay few.
        request.environ[ROUTE_KEY] = request.url_rule.rule if request.url_rule else None

    @app.before_request
    def check_api_key() -> Response | None:
        if not keys.enabled or not request.path.startswith("/v1"):
            return None
        authorization = request.headers.get("Authorization")
        if keys.check(authorization) or keys.check_key(request.headers.get("x-api-key")):  # x-api-key: Anthropic's
            return None
        if not authorization and not request.headers.get("x-api-key"):
            message = (
                "You didn't provide an API key. You need to provide your API key in an Authorization header "
                "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header."
            )
        else:
            message = "Incorrect API key provided."
        return _error(APIError(401, message, "invalid_request_error", None, "invalid_api_key",
                               {"WWW-Authenticate": "Bearer"}))

    @app.before_request
    def refuse_while_draining() -> None:
        if request.path in _GENERATION_ROUTES:
            g.admitted = drain.admit()

    @app.teardown_request
    def release_admission(_: BaseException | None) -> None:
        # Runs before a stream's body is sent: by then the stream is tracked by itself.
        admitted = g.pop("admitted", None)
        if admitted is not None:
            drain.discard(admitted)

    @app.get("/health")
    def health() -> Response:
        if drain.draining:
            return _json({"status": "draining", "engine": None}, 503)
        # Through each model's channels: SERVING when one of its replicas is.
        statuses = {}
        for model_id, engines in models.clients(_metadata()).items():
            for engine in engines:
                try:
                    statuses[model_id] = engine.health(timeout=HEALTH_TIMEOUT_S, metadata=_metadata())
                except ConduitError:
                    statuses[model_id] = "UNREACHABLE"
                if statuses[model_id] == "SERVING":
                    break
        worst = [s for s in statuses.values() if s != "SERVING"]
        status = worst[0] if worst else "SERVING" if statuses else "UNREACHABLE"
        ok = status == "SERVING"
        body = {"status": "ok" if ok else "unavailable", "engine": status}
        if set(statuses) != {""}:
            body["models"] = statuses
        return _json(body, 200 if ok else 503)

    @app.get("/metrics")
    def metrics_text() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, 200, content_type=content_type)

    @app.get("/openapi.json")
    def openapi() -> Response:
        return _json(document)

    @app.get("/v1/models")
    def list_models() -> Response:
        if is_anthropic_request():
            return _json(model_list(models.list(metadata=_metadata()), started))
        return _json({"object": "list", "data": [_model_object(m, started) for m in models.list(metadata=_metadata())]})

    @app.get("/v1/models/<path:model_id>")
    def get_model(model_id: str) -> Response:
        if is_anthropic_request():
            return _json(model_object(models.info(model_id, metadata=_metadata()), started))
        return _json(_model_object(models.info(model_id, metadata=_metadata()), started))

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        plan = parse_chat(_body(), _request_id(), config.limits)
        return _generate(plan, f"chatcmpl-{uuid.uuid4().hex}", ChatStreamTranslator, chat_response)

    @app.post("/v1/completions")
    def completions() -> Response:
        plan = parse_completion(_body(), _request_id(), config.limits)
        return _generate(plan, f"cmpl-{uuid.uuid4().hex}", CompletionStreamTranslator, completion_response)

    def _generate(
        plan: GenerationPlan,
        response_id: str,
        translator_class: type[ChatStreamTranslator] | type[CompletionStreamTranslator],
        build: Callable[[str, int, str, GenerationPlan, Collector], dict[str, Any]],
    ) -> Response:
        model, stream = relay.open(plan.model, plan.requests)
        created = int(time.time())
        if plan.stream:
            return relay.sse(stream, lambda: OpenAIEvents(translator_class(response_id, created, model, plan)))
        collected = relay.collect(stream)
        if collected is None:
            return Response(status=499)
        return _json(build(response_id, created, model, plan, collected))

    register_messages(app, relay, models, config.limits, _body, _request_id, _metadata)
    register_embeddings(app, models, drain, config.request_timeout_s, _body, _request_id, _metadata, _json)
    return ObservedApp(app, metrics, ShimState(drain, metrics))

