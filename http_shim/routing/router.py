"""Per-request routing over replicas: the router picks a replica for each engine call.

`Router.engine(model)` is what the relay calls instead of one engine client: a `RoutedEngine`
whose `generate_shared` picks a replica among the healthy ones serving the model (policies.py),
remembers the request's prefix there (prefix.py), and starts the call on that replica's own
GenerateMany stream. A call refused before any answer (UNAVAILABLE: the replica died or drains;
RESOURCE_EXHAUSTED: its queue is full) goes to another replica serving the model; one that has
answered is never sent again (its client has seen output). With no healthy replica the call is
tried on the others anyway, so the client gets the engine's own refusal (503) rather than a guess.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from clients.engine_client import EngineClient, GenerateStream, Metadata
from clients.errors import ConduitError, from_status
from clients.many_calls import ManyCall
from conduit.v1 import engine_pb2 as pb

from .policies import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_POLICY, Choice, make_policy
from .pool import ReplicaPool
from .prefix import prefix_blocks
from .replica import SERVING, Replica

# Refusals before any answer that another replica may not give.
_RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclass(frozen=True)
class RoutingConfig:
    policy: str = DEFAULT_POLICY
    balance_abs: int = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL

    def __post_init__(self) -> None:
        make_policy(self.policy)  # raises ValueError for an unknown name
        if self.balance_abs < 0 or self.balance_rel < 1.0:
            raise ValueError("the balance thresholds are a count >= 0 and a ratio >= 1")


class Router:
    def __init__(self, targets: Sequence[str], connect: Callable[..., EngineClient], config: RoutingConfig,
                 metrics: Any = None) -> None:
        """`metrics`: the shim's (metrics.py), whose router_* metrics this keeps; None: none kept."""
        self._policy = make_policy(config.policy, config.balance_abs, config.balance_rel)
        self._metrics = metrics
        self._lock = threading.Lock()
        self.pool = ReplicaPool(targets, connect, self._replica_changed)

    def engine(self, model: str) -> RoutedEngine:
        return RoutedEngine(self, model)

    def serving(self, model: str) -> list[Replica]:
        """The replicas listing `model`, healthy ones first."""
        replicas = [replica for replica in self.pool.replicas() if replica.serves(model)]
        return sorted(replicas, key=lambda replica: replica.state != SERVING)

    def choose(self, model: str, request: pb.GenerateRequest, exclude: Iterable[Replica] = ()) -> Choice | None:
        """A replica for `request` (not one of `exclude`), its prefix remembered there; None when
        every replica serving `model` was excluded."""
        blocks = prefix_blocks(request)
        with self._lock:
            candidates = [replica for replica in self.serving(model) if replica not in exclude]
            if not candidates:
                return None
            healthy = [replica for replica in candidates if replica.state == SERVING]
            choice = self._policy.choose(healthy, blocks) if healthy else Choice(candidates[0], "unhealthy")
            choice.replica.prefixes.add(blocks)
        if self._metrics is not None:
            self._metrics.router_requests.labels(choice.replica.address, choice.reason).inc()
        return choice

    def retried(self, replica: Replica) -> None:
        if self._metrics is not None:
            self._metrics.router_retries.labels(replica.address).inc()

    def _replica_changed(self, replica: Replica) -> None:
        """Its gauges read it when scraped, from its arrival until it is retired."""
        if self._metrics is None:
            return
        gauges = (self._metrics.router_replica_healthy, self._metrics.router_replica_load)
        if replica.retired:
            for gauge in gauges:
                gauge.remove(replica.address)
        else:
            gauges[0].labels(replica.address).set_function(lambda: replica.state == SERVING)
            gauges[1].labels(replica.address).set_function(lambda: replica.load)


class RoutedCall:
    """One Generate call as the relay sees it (ManyCall's interface), placed by the router."""

    def __init__(self, router: Router, model: str, request: pb.GenerateRequest, timeout: float | None,
                 metadata: Metadata) -> None:
        self._router = router
        self._model = model
        self._request = request
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._metadata = metadata
        self._tried: list[Replica] = []
        self._answered = False
        self._closed = False
        self._call: ManyCall | GenerateStream | None = None
        self._replica: Replica | None = None
        if not self._start():
            raise from_status(grpc.StatusCode.UNAVAILABLE, f"no engine replica serves {model!r}")

    def _start(self) -> bool:
        choice = self._router.choose(self._model, self._request, self._tried)
        if choice is None:
            return False
        self._replica = replica = choice.replica
        self._tried.append(replica)
        replica.call_started()
        timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 1e-3)
        self._call = replica.client.generate_shared(self._request, timeout=timeout, metadata=self._metadata)
        return True

    def __iter__(self) -> RoutedCall:
        return self

    def __next__(self) -> pb.GenerateResponse:
        while True:
            try:
                response = next(self._call)
            except StopIteration:
                self._ended()
                raise
            except ConduitError as error:
                replica = self._replica
                self._ended()
                if self._answered or self._closed or error.code not in _RETRY_ELSEWHERE:
                    raise
                if error.code == grpc.StatusCode.UNAVAILABLE:
                    replica.suspect()
                self._router.retried(replica)
                if not self._start():
                    raise
                continue
            self._answered = True
            return response

    def _ended(self) -> None:
        if self._replica is not None:
            self._replica.call_ended()
            self._replica = None

    def close(self) -> None:
        self._closed = True
        if self._call is not None:
            self._call.close()

    def __enter__(self) -> RoutedCall:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RoutedEngine:
    """The engine client interface the shim uses (generate_shared, health, model_info, tokenize),
    over the replicas serving one model."""

    def __init__(self, router: Router, model: str) -> None:
        self._router = router
        self.model = model

    def generate_shared(self, request: pb.GenerateRequest, /, *, timeout: float | None = None,
                        metadata: Metadata | None = None) -> RoutedCall:
        return RoutedCall(self._router, self.model, request, timeout, tuple(metadata or ()))

    def health(self, *, timeout: float | None = None, metadata: Metadata | None = None) -> str:
        """SERVING when one of its replicas says so now (asked, not remembered: a readiness probe)."""
        status = "UNREACHABLE"
        for replica in self._router.serving(self.model):
            try:
                status = replica.client.health(timeout=timeout, metadata=metadata)
            except ConduitError:
                continue
            if status == SERVING:
                break
        return status

    def model_info(self, *args: Any, **kwargs: Any) -> pb.ModelInfo:
        """EngineClient.model_info, on a replica serving the model."""
        return self._unary(lambda client: client.model_info(*args, **kwargs))

    def tokenize(self, *args: Any, **kwargs: Any) -> pb.TokenizeResponse:
        """EngineClient.tokenize, on a replica serving the model."""
        return self._unary(lambda client: client.tokenize(*args, **kwargs))

    def _unary(self, call: Any) -> Any:
        """`call(client)` on the healthy replicas in turn until one answers; the last error if none does."""
        error: ConduitError | None = None
        for replica in self._router.serving(self.model):
            try:
                return call(replica.client)
            except ConduitError as exc:
                if exc.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                error = exc
        raise error or from_status(grpc.StatusCode.UNAVAILABLE, f"no engine replica serves {self.model!r}")
