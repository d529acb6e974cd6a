"""Server-sent events framing."""

from __future__ import annotations

import json
from typing import Any

# Proxies (nginx in particular) buffer responses unless told not to; clients must not cache a stream.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CONTENT_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
# An SSE comment: clients ignore it, but writing it is how WSGI learns that the client has gone.
HEARTBEAT = b": keep-alive\n\n"


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def named_event(data: dict[str, Any]) -> bytes:
    """An event whose `event:` line is its `type` (the Responses and Messages APIs' streams)."""
    return f"event: {data['type']}\n".encode() + event(data)
