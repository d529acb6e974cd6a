"""How the router picks one replica for a request among the healthy ones serving its model (`--routing`,
docs/operations.md#replicas-and-several-models). cache_aware is SGLang's cache-aware policy (cache
threshold, the roomiest cache on a miss, absolute and relative balance thresholds) on replica.py's load.
Every policy says why it chose (`Choice.reason`): the shim's metrics count the reasons.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from .replica import Replica

POLICIES = ("cache_aware", "least_load", "round_robin")
DEFAULT_POLICY = "cache_aware"
# Share of the input's blocks a replica must hold for the request to follow its prefix there.
MIN_MATCH = 0.5
DEFAULT_BALANCE_ABS = 8
DEFAULT_BALANCE_REL = 1.5

# What a replica holds of prompts (`len` and `match(blocks)`): the shim's text view (prefix.PrefixIndex)
# by default, or its engine's KV events (kv_index.KvIndex).
View = Callable[[Replica], Any]
text_view: View = attrgetter("prefixes")


@dataclass(frozen=True)
class Choice:
    replica: Replica
    # round_robin, least_load, cache_hit (followed its prefix), cache_miss (no replica held
    # enough of it: least loaded), load_override (the holder was too loaded: least loaded).
    reason: str


class RoundRobin:
    """Each set of replicas in turn (a model's replicas are dealt in turn, whatever other models'
    requests come between)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, ...], itertools.count] = {}

    def choose(self, replicas: Sequence[Replica], blocks: Sequence[int] = (), view: View = text_view) -> Choice:
        """`replicas` (not empty) in a stable order; `blocks` the request's prefix hashes in `view(replica)`."""
        key = tuple(replica.address for replica in replicas)
        turn = next(self._counters.setdefault(key, itertools.count()))
        return Choice(replicas[turn % len(replicas)], "round_robin")


class LeastLoad:
    def __init__(self) -> None:
        self._turns = RoundRobin()

    def least_loaded(self, replicas: Sequence[Replica]) -> Replica:
        """The least loaded replica; among equals, each in turn (so an idle set is dealt round robin)."""
        lowest = min(replica.load for replica in replicas)
        return self._turns.choose([replica for replica in replicas if replica.load == lowest]).replica

    def choose(self, replicas: Sequence[Replica], blocks: Sequence[int] = (), view: View = text_view) -> Choice:
        return Choice(self.least_loaded(replicas), "least_load")


class CacheAware:
    def __init__(self, balance_abs: int = DEFAULT_BALANCE_ABS, balance_rel: float = DEFAULT_BALANCE_REL) -> None:
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self._least = LeastLoad()

    def choose(self, replicas: Sequence[Replica], blocks: list[int], view: View = text_view) -> Choice:
        least = self._least.least_loaded(replicas)
        if not blocks:
            return Choice(least, "cache_miss")
        matches = [(view(replica).match(blocks), replica) for replica in replicas]
        best = max(matched for matched, _ in matches)
        if best < MIN_MATCH * len(blocks) or best == 0:
            return Choice(self._roomiest(replicas, least), "cache_miss")
        holder = min((replica for matched, replica in matches if matched == best), key=lambda r: r.load)
        if self._overloaded(holder, least):
            return Choice(least, "load_override")
        return Choice(holder, "cache_hit")

    def _roomiest(self, replicas: Sequence[Replica], least: Replica) -> Replica:
        """Where a new prefix goes: the replica this shim sent the fewest recent prefixes (so the set's
        prefixes spread evenly: one over-full cache would evict them all in turn), unless it is overloaded;
        among equals the least loaded. Counted in the text view whatever view matched: a warm engine's
        cache is always full (released blocks stay until evicted), so its KV events tell nothing of room."""
        roomiest = min(replicas, key=lambda replica: (len(replica.prefixes), replica is not least, replica.load))
        if self._overloaded(roomiest, least):
            return least
        return roomiest

    def _overloaded(self, replica: Replica, least: Replica) -> bool:
        return replica.load - least.load > self.balance_abs and replica.load > self.balance_rel * least.load


def prefer_resident(replicas: Sequence[Replica], model: str, balance_abs: int = DEFAULT_BALANCE_ABS,
                    balance_rel: float = DEFAULT_BALANCE_REL) -> Sequence[Replica]:
    """For a LoRA adapter's request: the replicas where it is resident (one elsewhere must first bring it in,
    evicting another, or wait for a slot), unless all of those are loaded beyond the balance thresholds
    (cache_aware's) compared with the least loaded; for any other model, `replicas`."""
    resident = [replica for replica in replicas if replica.resident(model)]
    if not resident or len(resident) == len(replicas):
        return replicas
    least, best = min(replica.load for replica in replicas), min(replica.load for replica in resident)
    if best - least > balance_abs and best > balance_rel * least:
        return replicas
    return resident


def make_policy(name: str, balance_abs: int = DEFAULT_BALANCE_ABS,
                balance_rel: float = DEFAULT_BALANCE_REL) -> RoundRobin | LeastLoad | CacheAware:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_load":
        return LeastLoad()
    if name == "cache_aware":
        return CacheAware(balance_abs, balance_rel)
    raise ValueError(f"unknown routing policy {name!r}; one of {', '.join(POLICIES)}")
