"""One engine replica as the router sees it: its own channel (so its own GenerateMany stream), health,
load, the models it serves, the prompt prefixes it was sent and, with KV events, its cache's blocks.

A watcher thread (a greenlet in the shim) polls GetLoad: a refused connection makes it UNREACHABLE at
once (down, or still loading), a slow answer only after SLOW_POLLS in a row; it is SERVING only once its
models are listed. Its load adds this shim's calls since the last report to the engine's own count, so a
burst between two polls does not all land on one replica.
"""

from __future__ import annotations

import logging
import threading

import grpc

from clients.engine_client import EngineClient
from clients.errors import ConduitError
from conduit.v1 import engine_pb2 as pb

from . import kv_feed
from .kv_index import KvIndex
from .prefix import PrefixIndex

log = logging.getLogger("http_shim.routing")

SERVING = "SERVING"
NOT_SERVING = "NOT_SERVING"  # draining, or health says so
UNREACHABLE = "UNREACHABLE"  # down, loading, or not yet asked
POLL_INTERVAL_S = 0.25
POLL_TIMEOUT_S = 1.0
# Timed-out polls in a row that make a replica unreachable (a refused connection does at once).
SLOW_POLLS = 3
LIST_TIMEOUT_S = 2.0


class Replica:
    def __init__(self, address: str, client: EngineClient, kv_events: bool = False) -> None:
        """`kv_events`: follow the engine's KV events (`kv`, kv_feed.py), where it publishes them."""
        self.address = address
        self.client = client
        self.state = UNREACHABLE
        self.report: pb.LoadReport | None = None
        self.models: list[pb.ModelInfo] = []  # as last listed; kept while it is away
        self.listed = False  # it has said what it serves (until then its models are unknown, not none)
        self.prefixes = PrefixIndex()
        self.kv = KvIndex() if kv_events else None
        self.inflight = 0  # this shim's calls running there
        self._delta = 0  # this shim's calls started minus ended since the last report
        self._stop = threading.Event()  # it retired: its watcher and KV feed end
        self.polled = threading.Event()  # set once its first poll (and listing) is done
        self.retired = False
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._watch, name=f"replica-{self.address}", daemon=True).start()
        if self.kv is not None:
            threading.Thread(target=kv_feed.follow, args=(self.address, self.client, self.kv, self._stop),
                             name=f"kv-events-{self.address}", daemon=True).start()

    @property
    def load(self) -> int:
        """Requests running and waiting there, as the engine last said, plus this shim's since."""
        reported = self.report.running_requests + self.report.waiting_requests if self.report else 0
        return max(reported + self._delta, self.inflight, 0)

    def serves(self, model: str) -> bool:
        return any(info.id == model for info in self.models)

    def adapter(self, model: str) -> bool:
        """`model` is a LoRA adapter here (its KV events carry its name: kv_index.py)."""
        return any(info.id == model and info.parent for info in self.models)

    def resident(self, model: str) -> bool:
        """`model` is a LoRA adapter resident here, as the last load report said (not kept on the host)."""
        return self.report is not None and model in self.report.resident_adapters

    def call_started(self) -> None:
        with self._lock:
            self.inflight += 1
            self._delta += 1

    def call_ended(self) -> None:
        with self._lock:
            self.inflight -= 1
            self._delta -= 1
            idle_and_retired = self.retired and not self.inflight
        if idle_and_retired:
            self.client.close()

    def suspect(self) -> None:
        """A call found it unreachable (or refusing): no new work until its next poll says otherwise."""
        if self.state == SERVING:
            self._set(UNREACHABLE)

    def retire(self) -> None:
        """It left the set: no more polls, and its channel closes once the calls running there have ended."""
        self.retired = True
        self._stop.set()
        self.state = UNREACHABLE
        with self._lock:
            idle = not self.inflight
        if idle:
            self.client.close()

    def _watch(self) -> None:
        use_load = True
        slow = 0  # polls in a row that timed out
        while not self._stop.is_set():
            report = None
            try:
                if use_load:
                    report = self.client.load(timeout=POLL_TIMEOUT_S)
                    state = NOT_SERVING if report.draining else SERVING
                else:
                    state = SERVING if self.client.health(timeout=POLL_TIMEOUT_S) == SERVING else NOT_SERVING
            except ConduitError as error:
                if error.code == grpc.StatusCode.UNIMPLEMENTED and use_load:
                    use_load = False  # an engine from before GetLoad: health alone, load counted here
                    continue
                slow = slow + 1 if error.code == grpc.StatusCode.DEADLINE_EXCEEDED else 0
                # A refused connection is news at once; a busy engine slow to answer, only when it stays so.
                state = self.state if 0 < slow < SLOW_POLLS else UNREACHABLE
            else:
                slow = 0
            if report is not None:
                with self._lock:
                    self.report, self._delta = report, 0
                self.prefixes.size_for_cache(report.num_blocks, report.block_size)
            if state == SERVING and self.state != SERVING and self.refresh_models() is not None:
                # Not serving until it says what it serves (an engine just up may be too busy to
                # answer at once): asked again at the next poll, not left unlisted until the cache expires.
                state = self.state
            if state != self.state and not self.retired:
                self._set(state)
            self.polled.set()
            self._stop.wait(POLL_INTERVAL_S)

    def refresh_models(self, wait: bool = False) -> ConduitError | None:
        """Asks it what it serves now; the error when it did not answer. `wait`: up to LIST_TIMEOUT_S for
        it to be reachable (it may have just come back, its channel still waiting to reconnect)."""
        try:
            self.models = self.client.list_models(timeout=LIST_TIMEOUT_S, wait_for_ready=wait)
        except ConduitError as error:
            return error
        self.listed = True
        return None

    def _set(self, state: str) -> None:
        log.info("engine replica %s: %s -> %s", self.address, self.state, state)
        if state == UNREACHABLE:
            self.prefixes.clear()  # a restarted engine starts with an empty cache
        self.state = state
