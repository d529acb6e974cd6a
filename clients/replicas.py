"""Several engine replicas behind one gRPC channel, without a router.

The channel spreads calls with gRPC's own `round_robin` policy, skips replicas whose
grpc.health.v1 status is not SERVING (down, loading, or draining) by client-side health
checking, and retries a call that failed with UNAVAILABLE before the engine answered
anything, on another replica. A stream that already sent a message is never retried: gRPC
commits a call at its first response, and a committed call is not retried.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Sequence

# Bounded: a replica set that is entirely down fails fast with UNAVAILABLE.
RETRY_POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.05s",
    "maxBackoff": "0.5s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": ""},
    "methodConfig": [{"name": [{}], "retryPolicy": RETRY_POLICY}],
}


def split_addresses(values: str | Sequence[str]) -> list[str]:
    """"A,B" or ["A", "B,C"] -> ["A", "B", "C"], blanks dropped."""
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def _host_port(address: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"engine address {address!r} is not HOST:PORT")
    return host.strip("[]"), port


def _literal(host: str) -> str:
    """An IP literal for `host`: gRPC's ipv4:/ipv6: address lists take no names."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]


def channel_target(target: str | Sequence[str]) -> str:
    """The gRPC target for one address, a resolver URI (dns:///name:port, ipv4:..., unix:...),
    or several HOST:PORT addresses (a list or "A,B"), which become gRPC's multi-address
    `ipv4:` (or `ipv6:`) URI. Host names in a list are resolved once, here."""
    addresses = split_addresses(target)
    if not addresses:
        raise ValueError("no engine address given")
    if len(addresses) == 1:
        return addresses[0]
    if any("://" in a or a.startswith(("ipv4:", "ipv6:", "unix:", "dns:")) for a in addresses):
        raise ValueError("a list of engine addresses takes HOST:PORT items only; use one dns:/// target instead")
    resolved = []
    for address in addresses:
        host, port = _host_port(address)
        resolved.append((ipaddress.ip_address(_literal(host)), port))
    if all(ip.version == 4 for ip, _ in resolved):
        return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in resolved)
    if all(ip.version == 6 for ip, _ in resolved):
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for ip, port in resolved)
    raise ValueError("a list of engine addresses must be all IPv4 or all IPv6")


def spans_replicas(target: str) -> bool:
    """Whether a channel target may name several backends: a resolver URI or an address list."""
    return target.startswith(("dns:", "ipv4:", "ipv6:")) or "://" in target


def replica_options(target: str) -> list[tuple[str, object]]:
    """Channel options for `target` (made by `channel_target`): bounded retries of calls that
    produced nothing; for several backends also round robin with client-side health checking.
    One plain address gets no health checking, so that `health()` still reaches an engine
    that is NOT_SERVING (a health-checked channel fails every call to it with UNAVAILABLE)."""
    config = SERVICE_CONFIG if spans_replicas(target) else {"methodConfig": SERVICE_CONFIG["methodConfig"]}
    return [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]
