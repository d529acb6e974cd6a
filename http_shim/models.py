"""The models the engines serve, as the shim sees them, and where each request for one goes.

One engine address: its one channel answers for every model it lists (nothing to route). Several
addresses and/or dns:/// targets: each address (and each one a name resolves to) is a replica
(routing/) that says what it serves when it becomes ready and at each refresh; a request goes to a
healthy replica serving its model, picked by the routing policy. A replica that does not answer
keeps its last known models, so a restarted one gets work again. The list is cached (every request
names a model); replicas becoming ready update it at once, and so does a LoRA adapter loaded or unloaded
through the shim (`load_adapter`, `unload_adapter`: on every engine, each listed again at once).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from typing import Any

from clients.engine_client import EngineClient, Metadata
import grpc

from clients.errors import ConduitError, NotFound
from clients.replicas import spans_replicas, split_addresses
from conduit.v1 import engine_pb2 as pb

from .errors import model_not_found
from .routing import RoutedEngine, Router, RoutingConfig
from .routing.replica import SERVING, Replica

log = logging.getLogger("http_shim")

# Deadline of the small unary calls (ListModels, GetModelInfo).
RPC_TIMEOUT_S = 10.0
# LoadAdapter reads the adapter's files and moves its weights.
ADAPTER_TIMEOUT_S = 120.0
# An engine's refusal that says less than another's: it takes no adapters at run time, or is away.
_UNINFORMATIVE = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE)
# How long the model list is trusted; the engines rarely change what they serve.
MODELS_TTL_S = 30.0
# The youngest model list that an engine's "model not served here" throws away.
EXPIRE_MIN_AGE_S = 0.5

# connect(target) or connect(address, server_name): see routing/pool.py.
Connect = Callable[..., EngineClient]


class ServedModels:
    """Failed engine calls raise the client's ConduitError; an unknown model raises a 404 APIError
    that names the served ones."""

    def __init__(self, target: str | Sequence[str], connect: Connect, routing: RoutingConfig = RoutingConfig(),
                 metrics: Any = None) -> None:
        """`routing` and `metrics` (the shim's) serve several replicas; one address needs neither."""
        addresses = split_addresses(target)
        if not addresses:
            raise ValueError("no engine address given")
        one = len(addresses) == 1 and not spans_replicas(addresses[0])
        self._single = connect(addresses[0]) if one else None
        self._router = None if one else Router(addresses, connect, routing, metrics)
        self._models: list[pb.ModelInfo] = []  # one address: its list, as last read
        self._models_at = float("-inf")
        self._lock = threading.Lock()

    def list(self, max_age_s: float = MODELS_TTL_S, metadata: Metadata = ()) -> list[pb.ModelInfo]:
        with self._lock:
            fresh = time.monotonic() - self._models_at <= max_age_s
        if self._single is not None:
            if not fresh:
                models = self._single.list_models(timeout=RPC_TIMEOUT_S, metadata=metadata)
                with self._lock:
                    self._models, self._models_at = models, time.monotonic()
            return self._models
        if not fresh:
            errors = self._refresh_replicas(self._router.pool.replicas())
            with self._lock:
                self._models_at = time.monotonic()
            if not self._listed() and any(errors):
                raise next(error for error in errors if error is not None)
        return self._listed()

    def _refresh_replicas(self, replicas: list[Replica], wait: bool = False) -> list[ConduitError | None]:
        """Asks the replicas at once (threads: greenlets in the shim), so a dead one delays the rest
        little; `wait`: giving each a moment to become reachable (replica.py)."""
        if not replicas:
            return []
        with ThreadPoolExecutor(len(replicas)) as pool:
            return list(pool.map(lambda replica: replica.refresh_models(wait), replicas))

    def _listed(self) -> list[pb.ModelInfo]:
        """Every model a replica lists (or last listed), in the order the replicas were given."""
        infos: dict[str, pb.ModelInfo] = {}
        for replica in self._router.pool.replicas():
            for info in replica.models:
                infos.setdefault(info.id, info)
        return list(infos.values())

    def load_adapter(self, name: str, path: str, metadata: Metadata = ()) -> None:
        """LoadAdapter on every engine (each checks the path against its own --lora-dirs); done when one
        loaded it (the others may take no adapters, or serve another base model), else the most telling
        refusal is raised. The engines are listed again at once."""
        self._on_every_engine(lambda client: client.load_adapter(name, path, timeout=ADAPTER_TIMEOUT_S,
                                                                 metadata=metadata), f"load LoRA adapter {name!r}")

    def unload_adapter(self, name: str, metadata: Metadata = ()) -> None:
        """UnloadAdapter on every engine; done when one had it, else the most telling refusal."""
        self._on_every_engine(lambda client: client.unload_adapter(name, timeout=RPC_TIMEOUT_S, metadata=metadata),
                              f"unload LoRA adapter {name!r}")

    def _on_every_engine(self, call: Callable[[EngineClient], Any], what: str) -> None:
        engines = ({"engine": self._single} if self._single is not None
                   else {replica.address: replica.client for replica in self._router.pool.replicas()})
        with ThreadPoolExecutor(len(engines)) as pool:
            outcomes = list(pool.map(lambda client: _outcome(call, client), engines.values()))
        errors = [outcome for outcome in outcomes if outcome is not None]
        for address, error in zip(engines, outcomes):
            log.info("%s on %s: %s", what, address, "done" if error is None else f"{error.code.name}: {error.message}")
        self.changed()
        if len(errors) == len(outcomes):
            raise next((e for e in errors if e.code not in _UNINFORMATIVE), errors[0])

    def changed(self) -> None:
        """What the engines serve changed (an adapter loaded or unloaded): ask them now."""
        if self._router is None:
            with self._lock:
                self._models_at = float("-inf")
            return
        self._refresh_replicas(self._router.pool.replicas())
        with self._lock:
            self._models_at = time.monotonic()

    def expire(self) -> None:
        """An engine said it does not serve a model it was listed with (it restarted under another
        name): ask the engines again at the next request, at most twice a second."""
        with self._lock:
            if time.monotonic() - self._models_at > EXPIRE_MIN_AGE_S:
                self._models_at = float("-inf")

    def route(self, name: str, metadata: Metadata = ()) -> tuple[pb.ModelInfo, EngineClient | RoutedEngine]:
        """The served model called `name` and the engine client (over replicas: one routing each call) for
        its calls; a miss refreshes the cache once (an engine may have restarted or joined)."""
        for max_age_s in (MODELS_TTL_S, 1.0):
            for model in self.list(max_age_s, metadata):
                if model.id == name:
                    return model, self._single or self._router.engine(name)
            if self._router is not None and max_age_s == MODELS_TTL_S:
                # The replica serving it may have just come back, its channel still waiting to
                # reconnect: the ones away get a moment to answer.
                self._refresh_replicas([r for r in self._router.pool.replicas() if r.state != SERVING], wait=True)
        raise model_not_found(name, [model.id for model in self.list(metadata=metadata)])

    def info(self, name: str, metadata: Metadata = ()) -> pb.ModelInfo:
        """GetModelInfo from an engine that serves `name`, uncached."""
        try:
            _, client = self.route(name, metadata)
            return client.model_info(name, timeout=RPC_TIMEOUT_S, metadata=metadata)
        except NotFound:
            raise model_not_found(name, [model.id for model in self.list(metadata=metadata)]) from None

    def engine_states(self) -> dict[str, str]:
        """Several engines: each one's state by address (routing/replica.py); {} for one engine."""
        return {} if self._router is None else self._router.pool.states()

    def unlisted(self) -> list[str]:
        """The engines that have not yet said what they serve (routing/pool.py): while there are any, the
        models listed may lack theirs. One engine is asked at each listing, so it is never among them."""
        return [] if self._router is None else self._router.pool.unlisted()

    def clients(self, metadata: Metadata = ()) -> dict[str, EngineClient | RoutedEngine]:
        """Model id -> what answers for its health; with one address, also when it cannot be listed."""
        if self._single is not None:
            return {"": self._single}
        try:
            models = self.list(metadata=metadata)
        except ConduitError:
            models = self._listed()
        return {model.id: self._router.engine(model.id) for model in models}


def _outcome(call: Callable[[EngineClient], Any], client: EngineClient) -> ConduitError | None:
    try:
        call(client)
    except ConduitError as error:
        return error
    return None
