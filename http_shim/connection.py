"""Detecting a client that left while the shim waits on the engine.

WSGI only reports a disconnect when a write fails. A non-streaming response writes nothing until
the engine is done, so the shim peeks at the client socket instead: readable with no bytes means
the peer closed its side.
"""

from __future__ import annotations

import socket
from typing import Any

from gevent import select
from gevent.pywsgi import WSGIHandler

SOCKET_KEY = "conduit.client_socket"


class SocketExposingHandler(WSGIHandler):
    """gevent's handler, also putting the client socket in the WSGI environ."""

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        environ[SOCKET_KEY] = self.socket
        return environ


def client_gone(environ: dict[str, Any]) -> bool:
    sock = environ.get(SOCKET_KEY)
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
