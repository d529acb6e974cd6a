"""The Flask app: every API's routes (openai/, responses/, messages/, embeddings/, service.py,
playground.py) over the engines' gRPC API, and the hooks and error handlers they share. `create_app`
returns it inside the middleware that stamps request ids and records metrics (observe.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from clients.errors import ConduitError
from conduit_common.bearer import BearerSecrets

from .batches import DEFAULT_MAX_IN_FLIGHT as DEFAULT_BATCH_IN_FLIGHT
from .batches import open_batches
from .connection import ABANDON_BODY_KEY
from .context import ShimContext
from .auth import set_tenant
from .cors import CorsPolicy, install_cors
from .drain import Drain
from .embeddings import register_embeddings
from .embeddings.routes import EMBEDDINGS_ROUTE
from .files import FileLimits, FileStore, register_files
from .errors import APIError, from_engine_error, internal_error
from .limits import DEFAULT_LIMITS, RequestLimits
from .lora_adapters import register_lora_adapters
from .mcp import McpConfig
from .mcp.run import McpSettings
from .messages import is_anthropic_request, register_messages
from .messages.routes import GENERATION_ROUTES as MESSAGES_ROUTES
from .messages.routes import anthropic_error
from .metrics import ShimMetrics
from .models import Connect, ServedModels
from .observe import ROUTE_KEY, ObservedApp
from .openai import GENERATION_ROUTES as OPENAI_ROUTES
from .openai import register_openai
from .openapi_document import openapi_document
from .playground import playground
from .relay import Relay
from .retrieval import DEFAULT_RETRIEVAL_MODEL, open_retrieval
from .responses import RESPONSES_ROUTE, ResponseStore, StoreLimits, default_store_dir, register_responses
from .routing import RoutingConfig
from .service import register_service
from .web import json_response, request_id

log = logging.getLogger("http_shim")

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_GENERATION_ROUTES = (*OPENAI_ROUTES, RESPONSES_ROUTE, *MESSAGES_ROUTES)
# What a draining shim refuses (503) and waits for.
_ADMITTED_ROUTES = (*_GENERATION_ROUTES, EMBEDDINGS_ROUTE)


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
    # The Files API's limits (files/); its files live beside the Responses store (none without one).
    files_limits: FileLimits = FileLimits()
    # The embedding model vector stores and file_search embed with (retrieval/).
    retrieval_model: str = DEFAULT_RETRIEVAL_MODEL
    # The mcp tool of /v1/responses (mcp/): the servers it may reach (none by default) and its limits.
    mcp: McpConfig = McpConfig()
    # The Batch API's requests in the engines at once, all batches together (batches/runner.py).
    batch_max_in_flight: int = DEFAULT_BATCH_IN_FLIGHT


def _error(error: APIError) -> Response:
    """In the shape the client's API uses: OpenAI's, or Anthropic's (its routes, its SDKs)."""
    if is_anthropic_request():
        return anthropic_error(error, request_id())
    return json_response(error.body(), error.status, error.headers)


def create_app(config: ShimConfig, connect: Connect) -> ObservedApp:
    """`connect` makes the engine clients (one per engine address: see models.py), e.g. with credentials."""
    app = Flask("http_shim")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    install_cors(app, config.cors)  # first: a preflight is answered before keys are asked for
    app.register_blueprint(playground)
    metrics = ShimMetrics()
    models = ServedModels(config.engine, connect, config.routing, metrics)
    drain = Drain(metrics)
    relay = Relay(models, drain, metrics, config.heartbeat_s, config.request_timeout_s)
    ctx = ShimContext(relay, models, drain, metrics, config.limits, config.request_timeout_s, int(time.time()))
    keys = BearerSecrets(config.api_keys)  # the API keys (auth.py)
    _install_error_mapping(app, ctx, config.max_body_bytes)
    _install_hooks(app, ctx, keys)
    store_dir = default_store_dir() if config.responses_store_dir is None else config.responses_store_dir
    store = ResponseStore(store_dir, config.responses_store_limits) if store_dir else None
    files = FileStore(store_dir, config.files_limits) if store_dir else None
    register_service(app, ctx, openapi_document(config.limits, bool(keys)))
    register_openai(app, ctx)
    retrieval = None
    if files is not None:
        register_files(app, files)
        retrieval = open_retrieval(app, store_dir, files, models, config.retrieval_model)
        open_batches(app, store_dir, files, drain, metrics, config.batch_max_in_flight)
    register_responses(app, ctx, store, retrieval, McpSettings(config.mcp, metrics))
    register_messages(app, ctx)
    register_embeddings(app, ctx)
    register_lora_adapters(app, ctx)
    return ObservedApp(app, metrics, ctx)  # the server reaches the drain as `state.drain`


def _install_error_mapping(app: Flask, ctx: ShimContext, max_body_bytes: int) -> None:
    """Every failure becomes an APIError in the client's API's shape: ours, the engine's, werkzeug's, a bug."""

    @app.errorhandler(APIError)
    def on_api_error(error: APIError) -> Response:
        if error.code == "model_not_found" and request.path in _GENERATION_ROUTES:
            ctx.models.expire()  # the engine may have been renamed since the list was read
        if error.param == "response_format":  # the engine says "constraint": name the field the user sent
            body = g.get("body")  # the parsed request body, when it was read
            if isinstance(body, dict) and "structured_outputs" in body:
                error.param = "structured_outputs"
        return _error(error)

    @app.errorhandler(ConduitError)
    def on_engine_error(error: ConduitError) -> Response:
        return on_api_error(from_engine_error(error, request_id()))

    @app.errorhandler(HTTPException)
    def on_http_error(error: HTTPException) -> Response:
        messages = {
            404: (f"Unknown request URL: {request.method} {request.path}.", "unknown_url"),
            405: (f"Method {request.method} is not allowed for {request.path}.", "method_not_allowed"),
            413: (f"The request body is larger than {max_body_bytes} bytes.", "request_too_large"),
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
        return _error(internal_error(request_id()))


def _install_hooks(app: Flask, ctx: ShimContext, keys: BearerSecrets) -> None:
    @app.before_request
    def note_route() -> None:
        # For metrics: the rule, not the path, so label values stay few.
        request.environ[ROUTE_KEY] = request.url_rule.rule if request.url_rule else None

    @app.before_request
    def check_api_key() -> Response | None:
        if not keys or not request.path.startswith("/v1"):
            return None
        authorization, api_key = request.headers.get("Authorization"), request.headers.get("x-api-key")
        if keys.authorizes(authorization):
            set_tenant(authorization.strip().partition(" ")[2].strip())  # each key is a tenant of its own
            return None
        if keys.matches(api_key):  # x-api-key: Anthropic's, a bare key
            set_tenant(api_key)
            return None
        if not authorization and not api_key:
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
        if request.path in _ADMITTED_ROUTES:
            g.admitted = ctx.drain.admit()

    @app.teardown_request
    def release_admission(_: BaseException | None) -> None:
        # Runs before a stream's body is sent: by then the stream is tracked by itself.
        admitted = g.pop("admitted", None)
        if admitted is not None:
            ctx.drain.discard(admitted)
