"""OpenAI-shaped errors and the mapping from gRPC status codes to HTTP statuses.

Every failure the shim reports, before or during a stream, goes through `APIError` so clients
(the openai SDK in particular) always see `{"error": {"message", "type", "param", "code"}}`.
Failed engine calls arrive as the client library's `ConduitError`; `from_engine_error` maps them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from clients.errors import ConduitError

# Retry-After (seconds) sent with 429 when the engine does not suggest one.
DEFAULT_RETRY_AFTER_S = 1


@dataclass
class APIError(Exception):
    """An error to return to the HTTP client, with its status and OpenAI error fields."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def internal_error_message(message: str, request_id: str | None) -> str:
    """A 500's message, naming the request id (unless it already does) so the failure can be found in the logs."""
    if request_id and request_id not in message:
        return f"{message} (request id: {request_id})"
    return message


def internal_error(request_id: str | None) -> APIError:
    message = internal_error_message("The server had an internal error.", request_id)
    return APIError(500, message, "server_error", None, "internal_error")


def model_not_found(model: str, available: Sequence[str] = ()) -> APIError:
    """404 for an unknown model, naming the models that are served (when known)."""
    served = f" Available models: {', '.join(available)}." if available else ""
    return APIError(404, f"The model '{model}' does not exist.{served}", "invalid_request_error", "model",
                    "model_not_found")


def _retry_after(error: ConduitError) -> str:
    """The engine may suggest a delay in trailing metadata `retry-after`; otherwise a default."""
    suggested = error.metadata.get("retry-after", "")
    return suggested if suggested.isdigit() else str(DEFAULT_RETRY_AFTER_S)


# gRPC code -> (HTTP status, OpenAI error type, OpenAI error code).
_GRPC_TO_HTTP: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", None),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    # The engine refused the shim's own credentials: the operator's problem, not the user's key.
    grpc.StatusCode.UNAUTHENTICATED: (502, "server_error", "engine_auth_failed"),
    grpc.StatusCode.PERMISSION_DENIED: (502, "server_error", "engine_auth_failed"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "rate_limit_exceeded"),
    # nginx's "client closed request": the call was cancelled, normally because the client left.
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "request_cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error", "not_implemented"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "engine_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
}


def from_engine_error(error: ConduitError, request_id: str | None = None) -> APIError:
    """Translate a failed engine call; codes not listed (INTERNAL, UNKNOWN, ...) are engine bugs: 500,
    whose message names `request_id` (the HTTP request's), the key to the shim's and engine's logs."""
    code = error.code
    details = error.message or code.name
    status, kind, err_code = _GRPC_TO_HTTP.get(code, (500, "server_error", "engine_error"))
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"The engine is unavailable: {details}"
    if status == 502:
        details = f"The engine refused this server's credentials (check --engine-token and TLS): {details}"
    if status == 500:
        details = internal_error_message(f"The engine failed: {details}", request_id)
    headers = {"Retry-After": _retry_after(error)} if status in (429, 503) else {}
    param = "model" if code == grpc.StatusCode.NOT_FOUND else openai_param(error.param or "")
    return APIError(status, details, kind, param, error.error_code or err_code, headers)


# The engine names a bad field as a path in GenerateRequest; these are its OpenAI names.
_PROTO_TO_OPENAI_PARAM = {
    "text": "prompt",
    "token_ids": "prompt",
    "constraint": "response_format",
    "chat": "messages",
}


# A tool's parameters: "chat.tools[2].parameters_json" -> "tools[2].function.parameters".
_TOOL_PARAMETERS = re.compile(r"chat\.tools\[(\d+)\]\.parameters_json")


def openai_param(proto_path: str) -> str | None:
    """"sampling.top_p" -> "top_p", "chat.messages" -> "messages", "text" -> "prompt"."""
    if not proto_path:
        return None
    if proto_path in _PROTO_TO_OPENAI_PARAM:
        return _PROTO_TO_OPENAI_PARAM[proto_path]
    tool = _TOOL_PARAMETERS.fullmatch(proto_path)
    if tool is not None:
        return f"tools[{tool.group(1)}].function.parameters"
    return proto_path.rsplit(".", 1)[-1]
