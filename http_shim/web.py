"""What every route reads of the HTTP request it serves, and how it answers JSON: the request's id,
the engine calls' metadata, the body (size-limited; a JSON object of valid Unicode)."""

from __future__ import annotations

import json
from typing import Any

from flask import Response, current_app, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REQUEST_ID_METADATA_KEY

from .connection import ABANDON_BODY_KEY, READ_DONE_KEY, request_timeout_error
from .errors import invalid
from .observe import REQUEST_ID_KEY


def request_id() -> str:
    return request.environ.get(REQUEST_ID_KEY, "")


# Set in the environ of a Batch API line run through a route (batches/dispatch.py): its engine calls go
# at batch priority, below every interactive request (GenerateRequest.priority).
BATCH_LINE_KEY = "conduit.batch_line"


def engine_priority() -> int:
    """The priority of this request's engine calls: batch for a Batch API line, else interactive."""
    return pb.PRIORITY_BATCH if request.environ.get(BATCH_LINE_KEY) else pb.PRIORITY_INTERACTIVE


def engine_metadata() -> list[tuple[str, str]]:
    """gRPC metadata of every engine call: the HTTP request's id."""
    return [(REQUEST_ID_METADATA_KEY, request_id())]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, headers, mimetype="application/json")


def _read_bytes(limit: int) -> bytes:
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


def read_body() -> dict:
    """The JSON body (kept in `g.body` for the error handlers), or the 400 that says what is wrong with it."""
    try:
        body = json.loads(_read_bytes(current_app.config["MAX_CONTENT_LENGTH"]))
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise invalid("We could not parse the JSON body of your request.", code="invalid_json") from None
    g.body = check_body(body)
    return g.body


def check_body(body: Any) -> dict:
    """The request body must be a JSON object whose strings are valid Unicode: JSON escapes can spell
    lone surrogates ("\\ud800"), which protobuf strings cannot hold."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise invalid("The request body contains invalid Unicode (a lone surrogate).", code="invalid_json") from None
    return body
