"""WSGI middleware around the Flask app: the request id, metrics and the access log of every request.

It runs outside Flask so that every response carries `X-Request-Id` (errors Flask makes itself,
413s and streams included) and so that a stream is measured and logged when its last byte is
written, not when Flask returns it. The id is the client's `X-Request-Id` when acceptable (printable
ASCII, no longer than gRPC metadata accepts), else a new one; it is sent to the engine and, held in
conduit_common.logs.REQUEST_ID for the life of the request, named in every log line about it.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from conduit_common.logs import MAX_REQUEST_ID_CHARS, REQUEST_ID

from .metrics import UNMATCHED_ROUTE, ShimMetrics

REQUEST_ID_KEY = "conduit.request_id"
ROUTE_KEY = "conduit.route"  # set by the app once Flask matched a route

_ACCEPTABLE_ID = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_REQUEST_ID_CHARS)

access_log = logging.getLogger("http_shim.access")


class ObservedApp:
    """`app` wrapped; `state` is whatever the server around it needs to reach (the app's ShimContext)."""

    def __init__(self, app: Callable, metrics: ShimMetrics, state: Any = None) -> None:
        self.app = app
        self.metrics = metrics
        self.state = state

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        request_id = _accept_request_id(environ.get("HTTP_X_REQUEST_ID"))
        environ[REQUEST_ID_KEY] = request_id
        token = REQUEST_ID.set(request_id)
        started = time.perf_counter()
        status: list[str] = ["500"]
        self.metrics.requests_in_flight.inc()

        def start(status_line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
            status[0] = status_line.split(" ", 1)[0]
            headers = [(k, v) for k, v in headers if k.lower() != "x-request-id"]
            headers.append(("X-Request-Id", request_id))
            return start_response(status_line, headers, exc_info)

        def finish() -> None:
            seconds = time.perf_counter() - started
            route = environ.get(ROUTE_KEY) or UNMATCHED_ROUTE
            method = environ.get("REQUEST_METHOD", "")
            self.metrics.requests_in_flight.dec()
            self.metrics.requests.labels(route, method, status[0]).inc()
            self.metrics.duration.labels(route).observe(seconds)
            access_log.info("%s %s %s %.3fs", method, _path(environ), status[0], seconds)
            try:
                REQUEST_ID.reset(token)
            except ValueError:  # closed from another context (a killed greenlet): nothing to restore
                pass

        try:
            body = self.app(environ, start)
        except BaseException:
            finish()
            raise
        return _Closing(body, finish)


def _accept_request_id(header: str | None) -> str:
    if header is not None and _ACCEPTABLE_ID.fullmatch(header):
        return header
    return f"req_{uuid.uuid4().hex}"


def _path(environ: dict[str, Any]) -> str:
    """PATH_INFO as the client wrote it (WSGI hands it over as latin-1 decoded bytes)."""
    path = environ.get("PATH_INFO", "")
    try:
        return path.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return path


class _Closing:
    """The app's response iterable, calling `on_close` once after the app's own close."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None] | None) -> None:
        self._body = body
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is None:
            return
        try:
            getattr(self._body, "close", lambda: None)()
        finally:
            on_close()
