"""Engine channels that no HTTP proxy in the environment can serve go direct.

gRPC sends a channel through the HTTP CONNECT proxy named by grpc_proxy, https_proxy or http_proxy
unless no_grpc_proxy (else no_proxy) lists the target's host. It checks that list only for one
HOST:PORT: an address list (`ipv4:a:1,b:2`, clients/replicas.py) always goes to the proxy, which is
then asked to CONNECT to "a:1,b:2" and fails every call; and a loopback engine (the shim beside its
engine in one pod) is this host's, which a proxy elsewhere cannot reach. Those channels get
`grpc.enable_http_proxy` 0. Any other target (a name, dns:///, one remote address) keeps gRPC's own
rule, so a client that does reach a remote engine through a proxy still can.
"""

from __future__ import annotations

import ipaddress

DIRECT = [("grpc.enable_http_proxy", 0)]


def _addresses(target: str) -> list[str]:
    """The HOST:PORT items of a channel target (as channel_target makes them)."""
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            return target[len(scheme):].split(",")
    if target.startswith("dns:"):
        path = target[len("dns:"):]
        return [path.split("/", 3)[-1] if path.startswith("//") else path]
    return [target]


def _host(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():  # no port (gRPC's default 443), or a bare IPv6 literal
        host = address
    return host.strip("[]")


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_options(target: str) -> list[tuple[str, int]]:
    """Channel options for `target`: the HTTP proxy off for an address list or a loopback engine."""
    if target.startswith("unix:"):
        return []  # gRPC never proxies these
    addresses = _addresses(target)
    if len(addresses) > 1 or all(_is_loopback(_host(address)) for address in addresses):
        return list(DIRECT)
    return []
