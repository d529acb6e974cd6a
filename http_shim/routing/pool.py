"""The replicas behind the shim: one per engine address, and one per address a dns:/// name resolves to
(docs/operations.md#replicas-and-several-models). A dns:///NAME:PORT target (a Kubernetes headless
Service) is resolved at start, then every DNS_REFRESH_S (DNS_RETRY_S while it resolves to nothing): a new
address becomes a replica at once, one the name no longer returns is retired (no new work; its channel
closes when its calls end).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from clients.engine_client import EngineClient

from .replica import UNREACHABLE, Replica

log = logging.getLogger("http_shim.routing")

DNS_REFRESH_S = 5.0
DNS_RETRY_S = 1.0
# How long the pool waits at start for its replicas' first polls.
FIRST_POLL_WAIT_S = 1.5


def dns_name(target: str) -> tuple[str, str] | None:
    """(host, port) of a dns:[//authority/]HOST[:PORT] target; None for anything else."""
    if not target.startswith("dns:"):
        return None
    rest = target[len("dns:"):]
    if rest.startswith("//"):
        rest = rest[2:].partition("/")[2]  # the authority (a DNS server) is not ours to use
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or host.endswith(":"):  # no port, or a bare IPv6 literal
        host, port = rest, "443"
    return host.strip("[]"), port


def address_list(target: str) -> list[str]:
    """The addresses of an ipv4:A,B or ipv6:[A],[B] target; the target itself otherwise."""
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            return [part for part in target[len(scheme):].split(",") if part]
    return [target]


def resolve(host: str, port: str) -> list[str]:
    """HOST:PORT addresses the name resolves to now, sorted (so replicas keep a stable order)."""
    found = {info[4][0] for info in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)}
    return sorted(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in found)


class ReplicaPool:
    def __init__(self, targets: Sequence[str], connect: Callable[..., EngineClient],
                 on_change: Callable[[Replica], None] = lambda replica: None, kv_events: bool = False) -> None:
        """`connect(address)` makes a replica's client; for an address a name resolved to, `connect(address,
        name)`: the name its TLS certificate carries. `on_change(replica)`: one joined or retired. `kv_events`:
        each replica follows its engine's."""
        self._connect = connect
        self._kv_events = kv_events
        self._on_change = on_change
        self._replicas: dict[str, Replica] = {}
        self._owners: dict[str, str] = {}  # address -> the dns target it came from
        self._names = [target for target in targets if dns_name(target) is not None]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        for target in targets:
            name = dns_name(target)
            if name is None:
                for address in address_list(target):
                    self._add(address, "")
            else:
                found = self._resolve(target, *name)  # the first time here, so the replicas are there from the start
                threading.Thread(target=self._follow, args=(target, *name, found), name=f"dns-{target}",
                                 daemon=True).start()
        # Their first polls, so the first requests find the ready ones ready (a bounded wait).
        deadline = time.monotonic() + FIRST_POLL_WAIT_S
        for replica in self.replicas():
            replica.polled.wait(max(deadline - time.monotonic(), 0.0))

    def replicas(self) -> list[Replica]:
        with self._lock:
            return list(self._replicas.values())

    def states(self) -> dict[str, str]:
        """Each replica's state by address, and UNREACHABLE for a dns target that resolves to none."""
        with self._lock:
            owners = set(self._owners.values())
            states = {address: replica.state for address, replica in self._replicas.items()}
        return {**states, **{name: UNREACHABLE for name in self._names if name not in owners}}

    def unlisted(self) -> list[str]:
        """The engines that have not yet said what they serve, so the models listed may lack theirs: each
        address given, and each dns target none of whose addresses has (a name's pods come and go: one
        it adds later does not count)."""
        with self._lock:
            replicas = [(replica, self._owners[address]) for address, replica in self._replicas.items()]
        listed_names = {owner for replica, owner in replicas if owner and replica.listed}
        return ([replica.address for replica, owner in replicas if not owner and not replica.listed]
                + [name for name in self._names if name not in listed_names])

    def close(self) -> None:
        self._stop.set()
        for replica in self.replicas():
            replica.retire()

    def _add(self, address: str, owner: str, server_name: str = "") -> None:
        with self._lock:
            if address in self._replicas:
                return
            client = self._connect(address, server_name) if server_name else self._connect(address)
            replica = Replica(address, client, self._kv_events)
            self._replicas[address] = replica
            self._owners[address] = owner
        log.info("engine replica %s added%s", address, f" ({owner})" if owner else "")
        self._on_change(replica)
        replica.start()

    def _follow(self, target: str, host: str, port: str, found: bool) -> None:
        """Keeps the replicas behind a dns target in step with what the name resolves to."""
        while not self._stop.wait(DNS_REFRESH_S if found else DNS_RETRY_S):
            found = self._resolve(target, host, port)

    def _resolve(self, target: str, host: str, port: str) -> bool:
        """Adds the addresses `target` resolves to now and retires the ones it no longer does;
        False when it resolves to nothing (or not at all)."""
        try:
            addresses = resolve(host, port)
        except OSError as error:
            log.warning("cannot resolve %s: %s", target, error)
            return False
        for address in addresses:
            self._add(address, target, host)
        with self._lock:
            gone = [address for address, owner in self._owners.items()
                    if owner == target and address not in addresses]
            retired = [self._replicas.pop(address) for address in gone]
            for address in gone:
                del self._owners[address]
        for replica in retired:
            log.info("engine replica %s retired (%s no longer resolves to it)", replica.address, target)
            replica.retire()
            self._on_change(replica)
        return bool(addresses)
