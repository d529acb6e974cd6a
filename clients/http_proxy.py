"""Engine channels go direct: no HTTP proxy named in the environment takes them, unless the caller names
a proxy for them.

gRPC sends a channel through the HTTP CONNECT proxy that grpc_proxy, https_proxy or http_proxy names
unless no_grpc_proxy (else no_proxy) lists the target's host. Those variables are set for a host's way
out, rarely for reaching its engines: a loopback engine (the shim beside it in one pod) is this host's,
which a proxy elsewhere cannot reach; an engine named by a host name the list leaves out went to the
proxy; and an address list (`ipv4:a:1,b:2`, clients/replicas.py) always did, whatever no_proxy said,
which was then asked to CONNECT to "a:1,b:2". So every engine channel gets `grpc.enable_http_proxy` 0,
unless the caller names a proxy (`proxy=`, the shim's --engine-proxy): then gRPC's proxy rule with that
proxy (no_grpc_proxy / no_proxy still exempt the hosts they list).
"""

from __future__ import annotations

import re

DIRECT = [("grpc.enable_http_proxy", 0)]
# What gRPC can use: an HTTP CONNECT proxy, its credentials in the URL if any.
_PROXY_URL = re.compile(r"http://([^@/\s]+@)?[^@/\s]+:\d+/?")


def proxy_url(value: str) -> str:
    """`value`, checked to be http://[USER:PASSWORD@]HOST:PORT (an argparse `type`)."""
    if not _PROXY_URL.fullmatch(value):
        raise ValueError(f"an engine proxy is http://[USER:PASSWORD@]HOST:PORT, not {value!r}")
    return value


def proxy_options(target: str, proxy: str | None = None) -> list[tuple[str, object]]:
    """Channel options for `target`: no proxy, or the one `proxy` names."""
    if not proxy:
        return list(DIRECT)
    if target.startswith(("ipv4:", "ipv6:")) and "," in target:
        raise ValueError("an engine address list cannot go through a proxy (gRPC would ask it for all the "
                         "addresses as one); give one address or a dns:/// name")
    return [("grpc.enable_http_proxy", 1), ("grpc.http_proxy", proxy_url(proxy))]
