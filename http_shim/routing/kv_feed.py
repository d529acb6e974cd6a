"""One replica's KV-event subscription, keeping its KvIndex (kv_index.py) in step with the engine's cache.

Each stream starts with a snapshot of all the engine holds, so a reconnect simply starts over; the index
is `live` (usable by the router) only while a stream runs. An engine without the stream (older, or an
embedding engine) is asked again every NOT_OFFERED_RETRY_S; meanwhile its model is routed by text.
"""

from __future__ import annotations

import logging
import threading

import grpc

from clients.engine_client import EngineClient
from clients.errors import ConduitError

from .kv_index import KvIndex

log = logging.getLogger("http_shim.routing")

RETRY_S = 1.0  # after a stream ends or fails to open
NOT_OFFERED_RETRY_S = 60.0


class KvFeed:
    def __init__(self, address: str, client: EngineClient) -> None:
        self.address = address
        self.client = client
        self.index = KvIndex()
        self.live = False
        self._stream = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"kv-events-{address}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()

    def _follow(self) -> None:
        offered = True
        while not self._stop.is_set():
            try:
                offered = self._read()
            except ValueError:  # its channel was closed: the replica retired
                return
            finally:
                self.live = False
                self.index.clear()
            self._stop.wait(RETRY_S if offered else NOT_OFFERED_RETRY_S)

    def _read(self) -> bool:
        """Applies one stream's batches until it ends; False when the engine offers no events."""
        self._stream = stream = self.client.kv_events()
        if self._stop.is_set():  # stopped while it opened
            stream.close()
        expected = None
        try:
            for batch in stream:
                if expected is not None and batch.sequence_number != expected:
                    log.warning("KV events of %s: batch %d after %d; resubscribing", self.address,
                                batch.sequence_number, expected - 1)
                    return True
                expected = batch.sequence_number + 1
                self.index.apply(batch)
                if not self.live:
                    self.live = True
                    log.info("KV events of %s: following its prefix cache (%d blocks)", self.address,
                             len(self.index))
        except ConduitError as error:
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                log.info("engine %s publishes no KV events: routing its model by the text-prefix view",
                         self.address)
                return False
            if not self._stop.is_set() and self.live:
                log.info("KV events of %s ended (%s); resubscribing", self.address, error.code.name)
        finally:
            stream.close()
            self._stream = None
        return True
