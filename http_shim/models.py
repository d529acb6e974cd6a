"""The models the engines serve, as the shim sees them, and which engines serve each one.

One engine target (an address, or a dns:/// name whose replicas all serve the same model) is one
channel for every model it lists. Several targets (`--engine A,B,C`) may serve different models:
each is asked what it serves (ListModels), the addresses are grouped by model, and each group gets
one channel that spreads calls round robin over its healthy replicas (clients/replicas.py). A
dns:/// target among several is a group of its own; a model served by several such groups has its
requests dealt to them in turn. An
address that does not answer keeps its last known group, so a restarted replica gets work again
without restarting the shim; one never seen yet joins a group once it answers. Every request names
a model, so the list is cached.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

from clients.engine_client import EngineClient, Metadata
from clients.errors import ConduitError, NotFound
from clients.replicas import spans_replicas, split_addresses
from conduit.v1 import engine_pb2 as pb

from .errors import model_not_found

# Deadline of the small unary calls (ListModels, GetModelInfo).
RPC_TIMEOUT_S = 10.0
# Deadline of asking one address of several what it serves: a dead replica must not stall /v1/models.
PROBE_TIMEOUT_S = 2.0
# How long the model list is trusted; the engines rarely change what they serve.
MODELS_TTL_S = 30.0
# The youngest model list that an engine's "model not served here" throws away.
EXPIRE_MIN_AGE_S = 0.5

Connect = Callable[[str | Sequence[str]], EngineClient]


class ServedModels:
    """Failed engine calls raise the client's ConduitError; an unknown model raises a 404 APIError
    that names the served ones."""

    def __init__(self, target: str | Sequence[str], connect: Connect) -> None:
        addresses = split_addresses(target)
        if not addresses:
            raise ValueError("no engine address given")
        self._connect = connect
        # One target: its own channel answers for all its models. Several: one probe channel each.
        self._single = connect(addresses[0]) if len(addresses) == 1 else None
        self._probes = {} if self._single else {address: connect(address) for address in addresses}
        self._served: dict[str, list[pb.ModelInfo]] = {}  # address -> what it last said it serves
        self._groups: dict[tuple[str, ...], EngineClient] = {}  # replica set -> its channel (kept)
        self._routes: dict[str, tuple[EngineClient, ...]] = {}
        self._turns: dict[str, itertools.count] = {}  # model id -> whose turn among its groups
        self._models: list[pb.ModelInfo] = []
        self._models_at = float("-inf")
        self._lock = threading.Lock()

    def list(self, max_age_s: float = MODELS_TTL_S, metadata: Metadata = ()) -> list[pb.ModelInfo]:
        with self._lock:
            if time.monotonic() - self._models_at <= max_age_s:
                return self._models
        models, routes = self._refresh(metadata)
        with self._lock:
            self._models, self._routes, self._models_at = models, routes, time.monotonic()
        return models

    def _refresh(self, metadata: Metadata) -> tuple[list[pb.ModelInfo], dict[str, tuple[EngineClient, ...]]]:
        if self._single is not None:
            models = self._single.list_models(timeout=RPC_TIMEOUT_S, metadata=metadata)
            return models, {model.id: (self._single,) for model in models}
        error: ConduitError | None = None
        for address, probe in self._probes.items():
            try:
                self._served[address] = probe.list_models(timeout=PROBE_TIMEOUT_S, metadata=metadata)
            except ConduitError as exc:  # down or restarting: it keeps its last known group
                error = exc
        members: dict[str, list[str]] = {}
        infos: dict[str, pb.ModelInfo] = {}
        for address in self._probes:  # in the order given
            for info in self._served.get(address, []):
                infos.setdefault(info.id, info)
                members.setdefault(info.id, []).append(address)
        if not infos and error is not None:
            raise error
        routes = {}
        with self._lock:  # concurrent refreshes share one channel per replica set
            for model_id, entries in members.items():
                plain = tuple(entry for entry in entries if not spans_replicas(entry))
                keys = ([plain] if plain else []) + [(entry,) for entry in entries if spans_replicas(entry)]
                for key in keys:
                    if key not in self._groups:
                        self._groups[key] = self._connect(key[0] if len(key) == 1 else list(key))
                routes[model_id] = tuple(self._groups[key] for key in keys)
        return list(infos.values()), routes

    def expire(self) -> None:
        """An engine said it does not serve a model it was listed with (it restarted under another
        name): ask the engines again at the next request, at most twice a second."""
        with self._lock:
            if time.monotonic() - self._models_at > EXPIRE_MIN_AGE_S:
                self._models_at = float("-inf")

    def route(self, name: str, metadata: Metadata = ()) -> tuple[pb.ModelInfo, EngineClient]:
        """The served model called `name` and the channel to its engines; a miss refreshes the
        cache once (an engine may have restarted or joined)."""
        for max_age_s in (MODELS_TTL_S, 1.0):
            for model in self.list(max_age_s, metadata):
                if model.id == name:
                    with self._lock:
                        groups = self._routes[name]
                        turn = next(self._turns.setdefault(name, itertools.count()))
                    return model, groups[turn % len(groups)]
        raise model_not_found(name, [model.id for model in self._models])

    def resolve(self, name: str, metadata: Metadata = ()) -> pb.ModelInfo:
        return self.route(name, metadata)[0]

    def info(self, name: str, metadata: Metadata = ()) -> pb.ModelInfo:
        """GetModelInfo from an engine that serves `name`, uncached."""
        try:
            _, client = self.route(name, metadata)
            return client.model_info(name, timeout=RPC_TIMEOUT_S, metadata=metadata)
        except NotFound:
            raise model_not_found(name, [model.id for model in self._models]) from None

    def clients(self, metadata: Metadata = ()) -> dict[str, tuple[EngineClient, ...]]:
        """Model id -> its channels (for health); with one target, also when it cannot be listed."""
        if self._single is not None:
            return {"": (self._single,)}
        try:
            self.list(metadata=metadata)
        except ConduitError:
            pass
        with self._lock:
            return dict(self._routes)
