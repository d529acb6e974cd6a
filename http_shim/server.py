"""Serving the app on gevent's WSGIServer, and stopping it gracefully.

SIGTERM or SIGINT starts a drain (drain.py); once running generations finished the server stops and
the process exits 0. Past `drain_s` those still running are cut; a second signal cuts them at once
(Ctrl-C twice, or a launcher escalating SIGINT to SIGTERM).
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable

import gevent
from gevent.pool import Pool
from gevent.pywsgi import WSGIServer

from .connection import SocketExposingHandler
from .observe import ObservedApp

log = logging.getLogger("http_shim.server")

DEFAULT_DRAIN_S = 30.0
# Reading one request (line, headers, body) may take this long (connection.py).
DEFAULT_READ_TIMEOUT_S = 30.0
# Connections served at once (each SSE stream holds one); more wait in the listen backlog until
# one closes. Under the usual limit of 1024 open files, with room for the engine channels.
DEFAULT_MAX_CONNECTIONS = 1000
# After a cut, how long the cut streams get to write their error event before the server stops.
CUT_GRACE_S = 2.0
# How long server.stop waits for connection handlers (idle keep-alive ones) before killing them.
STOP_TIMEOUT_S = 1.0


def serve(
    app: ObservedApp,
    host: str,
    port: int,
    drain_s: float = DEFAULT_DRAIN_S,
    on_listening: Callable[[int], None] | None = None,
    read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serves until a signal's drain ends. `on_listening` gets the bound port."""
    server = WSGIServer(
        (host, port),
        app,
        handler_class=SocketExposingHandler,
        spawn=Pool(max_connections),  # full: no more connections are accepted until one closes
        log=None,  # the access log is the app's (observe.py): it carries the request id
        error_log=logging.getLogger("http_shim.wsgi"),
    )
    server.read_timeout_s = read_timeout_s  # the handler's (connection.py)
    server.start()
    # Each response's headers and body go out in separate writes: with Nagle's algorithm the body
    # waited for the client's delayed ACK of the headers, ~40 ms a small response (an embedding, a
    # model list). Accepted connections inherit the listener's TCP_NODELAY (Linux).
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    drain = app.state.drain

    def stop_gracefully(name: str) -> None:
        if drain.draining:
            log.warning("%s again: cutting %d running generations now", name, drain.cut())
            return
        drain.start()
        log.info("%s: draining (%d generations running, up to %.0fs)", name, drain.running, drain_s)
        if not drain.wait_idle(drain_s):
            log.warning("drain deadline passed: cutting %d running generations", drain.cut())
        if not drain.wait_idle(CUT_GRACE_S):
            log.warning("%d generations still running at stop", drain.running)
        log.info("drained; stopping")
        server.stop(timeout=STOP_TIMEOUT_S)

    for signum in (signal.SIGTERM, signal.SIGINT):
        name = signal.Signals(signum).name
        gevent.signal_handler(signum, lambda name=name: gevent.spawn(stop_gracefully, name))
    if on_listening is not None:
        on_listening(server.server_port)
    server.serve_forever()
