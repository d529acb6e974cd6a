"""Request ids and the shim's log lines.

Every HTTP request has one id: the client's `X-Request-Id` when it is acceptable (printable
ASCII, at most `MAX_REQUEST_ID_CHARS`; gRPC metadata accepts no more), otherwise a new one. It
is held in a context variable for the life of the request, so every log line written while the
request is handled (its stream included) carries it; gevent gives each connection's greenlet its
own context. `--log-format json` writes one JSON object per line: ts, level, logger, msg,
request_id (null for lines about no request), plus exc when an exception is logged.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar

MAX_REQUEST_ID_CHARS = 128
_ACCEPTABLE_ID = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_REQUEST_ID_CHARS)

# The id of the request this greenlet is handling; None outside requests.
REQUEST_ID: ContextVar[str | None] = ContextVar("conduit_request_id", default=None)

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s [%(request_id)s] %(message)s"


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def accept_request_id(header: str | None) -> str:
    """The client's X-Request-Id when it is printable ASCII of bounded length, else a new id."""
    if header is not None and _ACCEPTABLE_ID.fullmatch(header):
        return header
    return new_request_id()


def current_request_id() -> str | None:
    return REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Gives every record a `request_id` attribute: the one it was logged with, or the current request's."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "request_id", None) is None:
            record.request_id = "-"
            try:
                return super().format(record)
            finally:
                record.request_id = None
        return super().format(record)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Root logging to stderr in the chosen format, every record stamped with its request id."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else _TextFormatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
