"""One replica's KV-event subscription, keeping its KvIndex (kv_index.py) in step with the engine's cache.

Each stream starts with a snapshot of all the engine holds, so a reconnect simply starts over; the index
is `live` (usable by the router) only while a stream runs. An engine without the stream (older, or an
embedding engine) is asked again every NOT_OFFERED_RETRY_S; meanwhile its model is routed by text. It runs
on a thread of the replica's (replica.py) until the replica retires: its stream closes then, at its next
batch or with the replica's channel.
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


def follow(address: str, client: EngineClient, index: KvIndex, stop: threading.Event) -> None:
    """Subscribes to the engine at `address` again after each stream ends, until `stop` is set."""
    offered = True
    while not stop.is_set():
        try:
            offered = _read(address, client, index, stop)
        except ValueError:  # its channel was closed: the replica retired
            return
        finally:
            index.live = False
            index.clear()
        stop.wait(RETRY_S if offered else NOT_OFFERED_RETRY_S)


def _read(address: str, client: EngineClient, index: KvIndex, stop: threading.Event) -> bool:
    """Applies one stream's batches until it ends; False when the engine offers no events."""
    expected = None
    with client.kv_events() as stream:
        try:
            for batch in stream:
                if stop.is_set():
                    break
                if expected is not None and batch.sequence_number != expected:
                    log.warning("KV events of %s: batch %d after %d; resubscribing", address,
                                batch.sequence_number, expected - 1)
                    break
                expected = batch.sequence_number + 1
                index.apply(batch)
                if not index.live:
                    index.live = True
                    log.info("KV events of %s: following its prefix cache (%d blocks)", address, len(index))
        except ConduitError as error:
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                log.info("engine %s publishes no KV events: routing its model by the text-prefix view", address)
                return False
            if not stop.is_set() and index.live:
                log.info("KV events of %s ended (%s); resubscribing", address, error.code.name)
    return True
