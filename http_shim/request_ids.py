"""Request ids: one per HTTP request, sent to the engine and named in every log line about it.

The id is the client's `X-Request-Id` when it is acceptable (printable ASCII, at most
`MAX_REQUEST_ID_CHARS`; gRPC metadata accepts no more), otherwise a new one. observe.py holds it
in conduit_common.logs.REQUEST_ID for the life of the request, its stream included, so the log lines
written meanwhile carry it.
"""

from __future__ import annotations

import re
import uuid

from conduit_common.logs import MAX_REQUEST_ID_CHARS

_ACCEPTABLE_ID = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_REQUEST_ID_CHARS)


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def accept_request_id(header: str | None) -> str:
    """The client's X-Request-Id when it is printable ASCII of bounded length, else a new id."""
    if header is not None and _ACCEPTABLE_ID.fullmatch(header):
        return header
    return new_request_id()
