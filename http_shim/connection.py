"""The shim's connection handler: detecting a client that left, not reading refused bodies, and
bounding how long reading a request may take.

WSGI only reports a disconnect when a write fails, and a non-streaming response writes nothing until
the engine is done: `client_gone` peeks at the socket instead (readable with no bytes: the peer left).

gevent reads and discards the body an app left unread, to reuse the connection; for a body refused
as too large (413) that could be endless, so the app marks the request and the connection closes.

Reading a request (its line, headers and body; discarding a body left unread) must end within the
server's `read_timeout_s` (None: no bound), so a slow sender (slow loris) cannot hold a connection:
late headers get 408 here, a late body 408 from the app (web.py), and an idle keep-alive connection
closes. Writing the response has no timeout: an SSE stream stays open as it runs.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import gevent
from gevent import select
from gevent.pywsgi import WSGIHandler

from .errors import APIError

SOCKET_KEY = "conduit.client_socket"
# Set in the environ by the app: close the connection without reading the rest of the body.
ABANDON_BODY_KEY = "conduit.abandon_body"
# In the environ: call it once the body is read, so the read timeout no longer runs.
READ_DONE_KEY = "conduit.read_done"


def request_timeout_error() -> APIError:
    """408 for a request not received within the read timeout; its connection closes."""
    return APIError(408, "The request was not received in time: send its headers and body without pausing.",
                    "invalid_request_error", None, "request_timeout", {"Connection": "close"})


def _request_timeout_response() -> bytes:
    """The 408 as a whole HTTP/1.1 response, for the handler to write itself."""
    body = json.dumps(request_timeout_error().body()).encode()
    head = (f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class _Unread:
    """Stands in for gevent's request input once the body is abandoned: nothing left to discard."""

    def _discard(self) -> None:
        pass


class SocketExposingHandler(WSGIHandler):
    """gevent's handler, also putting the client socket in the WSGI environ, with a read timeout."""

    _reading: gevent.Timeout | None = None

    def handle_one_request(self) -> Any:
        self._reading = self._read_timer()  # from the wait for the request line on
        try:
            return super().handle_one_request()
        finally:
            self.done_reading()

    def _read_timer(self) -> gevent.Timeout | None:
        """A timer that raises TimeoutError where this connection's greenlet waits, once the read timeout is up."""
        timeout_s = getattr(self.server, "read_timeout_s", None)
        if not timeout_s:
            return None
        return gevent.Timeout.start_new(timeout_s, TimeoutError("the request was not received in time"))

    def done_reading(self) -> None:
        """The request is in (or its response begins): no read timeout from here on."""
        if self._reading is not None:
            self._reading.close()
            self._reading = None

    def _handle_client_error(self, ex: BaseException) -> Any:
        if isinstance(ex, TimeoutError):  # the headers did not come in time
            return "408", _request_timeout_response()
        return super()._handle_client_error(ex)

    def start_response(self, status: str, headers: list, exc_info: Any = None) -> Any:
        self.done_reading()  # writing the response has no timeout (an SSE stream may run for minutes)
        return super().start_response(status, headers, exc_info)

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ[SOCKET_KEY] = self.socket
        environ[READ_DONE_KEY] = self.done_reading
        if not environ.get("CONTENT_LENGTH") and not environ.get("HTTP_TRANSFER_ENCODING"):
            self.done_reading()  # no body to wait for
        return environ

    def run_application(self) -> None:
        try:
            super().run_application()
        finally:
            if self.environ.get(ABANDON_BODY_KEY):
                self._abandon_body()
            else:  # what the app left unread is discarded here, within the read timeout too
                self._reading = self._read_timer()
                try:
                    self.wsgi_input._discard()
                except TimeoutError:
                    self._abandon_body()
                finally:
                    self.done_reading()

    def _abandon_body(self) -> None:
        """The rest of the body is not read: this connection cannot carry another request."""
        self.close_connection = True
        self.wsgi_input = _Unread()


def client_gone(environ: dict[str, Any]) -> bool:
    sock = environ.get(SOCKET_KEY)
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
