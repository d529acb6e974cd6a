"""The shim's `APIError` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}, "request_id"}`.

The anthropic SDK picks its exception class from the status, so 503 becomes 529 `overloaded_error` (its
"overloaded, retry"). A prompt over the context is worded as Anthropic words it: Claude Code matches
"prompt is too long: N tokens > M maximum" to compact the conversation.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import APIError

OVERLOADED_STATUS = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED_STATUS: "overloaded_error",
}


# The engine's refusal of a prompt with no room left (engine_service/core/admission.py).
_ENGINE_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens, but the prompt has (\d+) tokens")


def anthropic_message(error: APIError) -> str:
    found = _ENGINE_TOO_LONG.search(error.message) if error.code == "context_length_exceeded" else None
    return f"prompt is too long: {found[2]} tokens > {found[1]} maximum" if found else error.message


def anthropic_status(status: int) -> int:
    return OVERLOADED_STATUS if status == 503 else status


def error_type(status: int) -> str:
    status = anthropic_status(status)
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_object(error: APIError) -> dict[str, Any]:
    """The inner object, as the stream's `error` event carries it too."""
    return {"type": error_type(error.status), "message": anthropic_message(error)}


def error_body(error: APIError, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": error_object(error), "request_id": request_id}
