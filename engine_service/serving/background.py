"""The engine's gRPC server on its own asyncio loop and thread, so the engine loop can own the
main thread: conduit.v1.Engine, grpc.health.v1 and reflection, with the port's security, and a
drain that a signal handler can start.

Needs no torch: the servicer is handed in, so the fast tests run this very server around a fake.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from conduit.v1 import engine_pb2_grpc as pb_grpc
from conduit.v1.contract import ENGINE_SERVICE, MESSAGE_SIZE_OPTIONS, SERVER_KEEPALIVE_OPTIONS
from engine_service.serving.security import ServerSecurity

log = logging.getLogger(__name__)


class BackgroundServer:
    """start() returns once the server listens and reports SERVING (or raises why it cannot)."""

    def __init__(self, servicer: pb_grpc.EngineServicer, host: str, port: int, *,
                 security: ServerSecurity | None = None, description: str = "",
                 companions: Sequence[Callable[[grpc.aio.Server], str]] = (),
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`loop`: the event loop to serve on (one the engine already sends its outputs to); a new one
        by default."""
        self.servicer = servicer
        self.companions = companions  # more services on the port: each adds itself, returns its name
        self.address = f"{host}:{port}"
        self.security = security or ServerSecurity()
        self.description = description
        self.port = port  # the bound port once started (port 0 picks one)
        self.draining = False
        self._loop = loop or asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._health: HealthServicer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._grace = 5.0
        self._thread = threading.Thread(target=self._run, name="grpc-server", daemon=True)

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def begin_drain(self, deadline: float) -> None:
        """Health NOT_SERVING and no new Generate calls from now on; the servicer (and through it
        the engine) finishes the rest by `deadline`. Safe to call from a signal handler: it only
        queues the work on the server's loop (no locks taken here)."""
        self._loop.call_soon_threadsafe(self._drain, deadline)

    def stop(self, grace: float = 5.0) -> None:
        """Stop serving: calls still running get `grace` seconds, then are cancelled."""
        self._grace = grace
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=grace + 10)

    def _drain(self, deadline: float) -> None:
        first = not self.draining
        self.draining = True
        begin = getattr(self.servicer, "begin_drain", None)  # refuse new work, finish the rest by deadline
        if begin is not None:
            begin(deadline)
        if first and self._health is not None:
            log.info("draining: health NOT_SERVING, new Generate calls refused")
            self._loop.create_task(self._health.enter_graceful_shutdown())

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start() when it happens before ready
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = grpc.aio.server(interceptors=self.security.interceptors(), options=[
            *MESSAGE_SIZE_OPTIONS,
            *SERVER_KEEPALIVE_OPTIONS,  # the clients' keepalive pings are welcome (contract.py)
            ("grpc.so_reuseport", 0),  # a port already taken is an error, not a shared listener
        ])
        pb_grpc.add_EngineServicer_to_server(self.servicer, server)
        companions = [add(server) for add in self.companions]
        self._health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (ENGINE_SERVICE, *companions, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        credentials = self.security.credentials()
        self.port = (server.add_secure_port(self.address, credentials) if credentials
                     else server.add_insecure_port(self.address))
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {self.address}")
        self.address = f"{self.address.rpartition(':')[0]}:{self.port}"
        await server.start()
        for name in ("", ENGINE_SERVICE, *companions):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("engine serving %s on %s (%s)", self.description, self.address, self.security.describe())
        self._ready.set()
        await self._stop.wait()
        await self._health.enter_graceful_shutdown()
        await server.stop(grace=self._grace)
