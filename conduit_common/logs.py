"""Logging for the engine and the shim: text or JSON lines, each naming the request it is about.

The request id reaches a log record in one of two ways: whoever serves one request sets
`REQUEST_ID` (asyncio gives each gRPC call its own context, gevent each connection's greenlet, so
it covers every line logged while serving it), and the engine thread, which serves many requests
at once, passes `extra=request_extra(request_id)` on the lines it logs about one of them.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from typing import Any

# The request being served in this context; None outside requests.
REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("conduit_request_id", default=None)

LOG_FORMATS = ("text", "json")
# The most of a caller's request id that is kept (gRPC metadata takes no more).
MAX_REQUEST_ID_CHARS = 128


def clean_request_id(value: str) -> str:
    """A caller's request id made fit for log lines and every message that echoes it: its first
    MAX_REQUEST_ID_CHARS characters, printable ones only (a line break would forge a log line)."""
    return "".join(c for c in value[:MAX_REQUEST_ID_CHARS] if c.isprintable())


def request_extra(request_id: str) -> dict[str, str]:
    """`extra=` for a log call about one request, from a thread that serves many."""
    return {"request_id": request_id}


class RequestIdFilter(logging.Filter):
    """Gives every record a `request_id` attribute: its own (from `extra`), the context's, or None."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    """`time LEVEL logger [request_id]: message` (the brackets only when the request is known)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request_tag = f" [{request_id}]" if request_id else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, request_id (null for lines
    about no request), exc (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Configure the root logger once, for the process (stderr)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
