"""The shim's connection handler: detecting a client that left, and not reading refused bodies.

WSGI only reports a disconnect when a write fails. A non-streaming response writes nothing until
the engine is done, so the shim peeks at the client socket instead: readable with no bytes means
the peer closed its side.

After a response gevent reads and discards whatever body the app left unread, to keep the
connection usable. For a body refused as too large (413) that would mean reading it anyway, up
to a Content-Length of any size or an endless chunked stream, so the app marks such a request
and the connection is closed instead.
"""

from __future__ import annotations

import socket
from typing import Any

from gevent import select
from gevent.pywsgi import WSGIHandler

SOCKET_KEY = "conduit.client_socket"
# Set in the environ by the app: close the connection without reading the rest of the body.
ABANDON_BODY_KEY = "conduit.abandon_body"


class _Unread:
    """Stands in for gevent's request input once the body is abandoned: nothing left to discard."""

    def _discard(self) -> None:
        pass


class SocketExposingHandler(WSGIHandler):
    """gevent's handler, also putting the client socket in the WSGI environ."""

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ[SOCKET_KEY] = self.socket
        return environ

    def run_application(self) -> None:
        try:
            super().run_application()
        finally:
            if self.environ.get(ABANDON_BODY_KEY):
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
