"""Per-request routing over replicas (docs/operations.md#replicas-and-several-models).

`Router.engine(model)` is what the relay calls instead of one engine client: a `RoutedEngine`, whose
calls go to a replica serving the model (policies.py). A call refused before any answer (_RETRY_ELSEWHERE)
is sent to another replica: `_Routed` says where, clients/call_attempts.py does it under one deadline.
With no healthy replica the call is tried on the others anyway, so the client gets the engine's own
refusal (503) rather than a guess.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import grpc

from clients.call_attempts import Attempt, AttemptedCall
from clients.engine_client import EngineClient, Metadata
from clients.errors import ConduitError, from_status
from conduit.v1 import engine_pb2 as pb

from ..metrics import ShimMetrics
from .policies import (DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_POLICY, CacheAware, Choice, View, make_policy,
                       prefer_resident)
from .pool import ReplicaPool
from .replica import SERVING, UNREACHABLE, Replica
from .request_prefix import RequestPrefix

# Refusals before any answer that another replica may not give.
_RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)

PREFIX_VIEWS = ("kv_events", "text")
DEFAULT_PREFIX_VIEW = "kv_events"


@dataclass(frozen=True)
class RoutingConfig:
    policy: str = DEFAULT_POLICY
    balance_abs: int = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL
    prefix_view: str = DEFAULT_PREFIX_VIEW

    def __post_init__(self) -> None:
        make_policy(self.policy)  # raises ValueError for an unknown name
        if self.prefix_view not in PREFIX_VIEWS:
            raise ValueError(f"unknown prefix view {self.prefix_view!r}; one of {', '.join(PREFIX_VIEWS)}")
        if self.balance_abs < 0 or self.balance_rel < 1.0:
            raise ValueError("the balance thresholds are a count >= 0 and a ratio >= 1")


class Router:
    def __init__(self, targets: Sequence[str], connect: Callable[..., EngineClient], config: RoutingConfig,
                 metrics: ShimMetrics | None = None) -> None:
        """`metrics`: the shim's, whose router_* metrics this keeps; None: kept in a registry nobody reads."""
        self._policy = make_policy(config.policy, config.balance_abs, config.balance_rel)
        self._balance = (config.balance_abs, config.balance_rel)
        self.metrics = metrics or ShimMetrics()
        self._lock = threading.Lock()
        self._engines: dict[str, RoutedEngine] = {}  # by model: a listed one
        # Only cache_aware reads prefixes: the others follow no events.
        self._kv_events = config.prefix_view == "kv_events" and isinstance(self._policy, CacheAware)
        self.pool = ReplicaPool(targets, connect, self._replica_changed, self._kv_events)

    def engine(self, model: str) -> RoutedEngine:
        """The model's one RoutedEngine (the embeddings coalescer keys its calls on it)."""
        with self._lock:
            return self._engines.setdefault(model, RoutedEngine(self, model))

    def serving(self, model: str) -> list[Replica]:
        """The replicas listing `model`, healthy ones first (a LoRA adapter is listed where it is loaded;
        `choose` prefers those where it is resident: policies.prefer_resident)."""
        replicas = [replica for replica in self.pool.replicas() if replica.serves(model)]
        return sorted(replicas, key=lambda replica: replica.state != SERVING)

    def choose(self, prefix: RequestPrefix, exclude: Iterable[Replica] = ()) -> Choice | None:
        """A replica for `prefix.request` (not one of `exclude`), its prefix remembered there; None when
        every replica serving the model was excluded."""
        candidates = [replica for replica in self.serving(prefix.model) if replica not in exclude]
        if not candidates:
            return None
        healthy = prefer_resident([replica for replica in candidates if replica.state == SERVING], prefix.model,
                                  *self._balance)
        tokens = self._token_blocks(healthy, prefix)  # outside the lock: it may ask an engine
        with self._lock:
            if not healthy:
                choice = Choice(candidates[0], "unhealthy")
            elif tokens is not None:
                choice = self._policy.choose(healthy, tokens, kv_view)
                kv_view(choice.replica).expect(tokens)
            else:
                choice = self._policy.choose(healthy, prefix.text)
            choice.replica.prefixes.add(prefix.text)
        self.metrics.router_requests.labels(choice.replica.address, choice.reason).inc()
        return choice

    def _token_blocks(self, healthy: list[Replica], prefix: RequestPrefix) -> list[int] | None:
        """The prompt's token blocks when the KV view decides: a choice to make, and every healthy
        replica following its engine's events with one block size; else None (the text view)."""
        if not self._kv_events or len(healthy) < 2 or not all(r.kv is not None and r.kv.live for r in healthy):
            return None
        sizes = {replica.kv.block_size or (replica.report.block_size if replica.report else 0)
                 for replica in healthy}
        if len(sizes) != 1 or 0 in sizes:
            return None
        return prefix.token_blocks(min(healthy, key=lambda replica: replica.load).client, sizes.pop(),
                                   prefix.model if any(r.adapter(prefix.model) for r in healthy) else "")

    def _replica_changed(self, replica: Replica) -> None:
        """Its gauges read it when scraped, from its arrival until it is retired."""
        gauges = [(self.metrics.router_replica_healthy, lambda: replica.state == SERVING),
                  (self.metrics.router_replica_load, lambda: replica.load)]
        if replica.kv is not None:
            gauges.append((self.metrics.router_replica_kv_blocks, lambda: len(replica.kv)))
        for gauge, read in gauges:
            if replica.retired:
                gauge.remove(replica.address)
            else:
                gauge.labels(replica.address).set_function(read)


kv_view: View = attrgetter("kv")


class _Routed:
    """One routed call: where its attempts go (a replica the router picks, and after a refusal before any
    answer, _RETRY_ELSEWHERE, another one serving the model, until none is left), and the attempt running,
    which its replica counts as running until it ends."""

    def __init__(self, router: Router, call: RequestPrefix) -> None:
        self._router = router
        self._call = call  # the request, its model and metadata, and its prefix kept over the attempts
        self._tried: list[Replica] = []  # the last one runs the attempt
        self._attempt: Attempt | None = None
        self._running = False

    def start(self, timeout_s: float | None) -> _Routed | None:
        choice = self._router.choose(self._call, self._tried)
        if choice is None:
            if not self._tried:
                raise from_status(grpc.StatusCode.UNAVAILABLE, f"no engine replica serves {self._call.model!r}")
            return None
        self._tried.append(choice.replica)
        choice.replica.call_started()
        self._running = True
        # On the replica's GenerateMany stream, not retried there: the router owns a routed call's retries.
        self._attempt = choice.replica.client.generate_shared(self._call.request, timeout=timeout_s,
                                                              metadata=self._call.metadata, retries=False)
        return self

    def __next__(self) -> pb.GenerateResponse:
        try:
            return next(self._attempt)
        except (StopIteration, ConduitError) as end:
            replica = self._tried[-1]
            if self._running:
                self._running = False
                replica.call_ended()
            if isinstance(end, ConduitError) and end.code == grpc.StatusCode.UNAVAILABLE:
                # Its connection died (keepalive) or it refused: no new work there until a poll says otherwise.
                replica.suspect()
            raise

    def close(self) -> None:
        self._attempt.close()

    def retry(self, failed: Attempt, error: ConduitError) -> bool:
        if error.code not in _RETRY_ELSEWHERE:
            return False
        self._router.metrics.router_retries.labels(self._tried[-1].address).inc()
        return True


def _on_a_replica(name: str) -> Callable[..., Any]:
    """EngineClient.<name>, on a replica serving the model (RoutedEngine._unary)."""
    def call(self: RoutedEngine, *args: Any, **kwargs: Any) -> Any:
        return self._unary(lambda client: getattr(client, name)(*args, **kwargs))
    return call


class RoutedEngine:
    """The engine client interface the shim uses (generate_shared, health, model_info, tokenize, embed,
    detokenize), over the replicas serving one model. Embed is idempotent: retried on UNAVAILABLE."""

    def __init__(self, router: Router, model: str) -> None:
        self._router = router
        self.model = model

    @property
    def width(self) -> int:
        """The replicas serving the model: how many calls of it can run side by side."""
        return max(len(self._router.serving(self.model)), 1)

    def generate_shared(self, request: pb.GenerateRequest, /, *, timeout: float | None = None,
                        metadata: Metadata | None = None) -> AttemptedCall:
        return AttemptedCall(_Routed(self._router, RequestPrefix(self.model, request, tuple(metadata or ()))), timeout)

    def health(self, *, timeout: float | None = None, metadata: Metadata | None = None) -> str:
        """SERVING when one of its replicas says so now (asked, not remembered: a readiness probe)."""
        status = UNREACHABLE
        for replica in self._router.serving(self.model):
            with suppress(ConduitError):
                status = replica.client.health(timeout=timeout, metadata=metadata)
                if status == SERVING:
                    break
        return status

    def _unary(self, call: Any) -> Any:
        """`call(client)` on the replicas serving the model, the healthy ones first and the least loaded
        of them first (an Embed of many inputs is real work: spread by load, as generation is), until
        one answers; the last error if none does. Counted in the replica's load while it runs."""
        error: ConduitError | None = None
        replicas = sorted(self._router.serving(self.model), key=lambda replica: (replica.state != SERVING,
                                                                                  replica.load))
        for replica in replicas:
            replica.call_started()
            try:
                return call(replica.client)
            except ConduitError as exc:
                if exc.code != grpc.StatusCode.UNAVAILABLE:
                    raise
                error = exc
            finally:
                replica.call_ended()
        raise error or from_status(grpc.StatusCode.UNAVAILABLE, f"no engine replica serves {self.model!r}")

    model_info = _on_a_replica("model_info")
    tokenize = _on_a_replica("tokenize")
    embed = _on_a_replica("embed")
    detokenize = _on_a_replica("detokenize")
