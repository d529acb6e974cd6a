"""Which MCP server URLs the shim may reach: the operator's list of URL prefixes (--mcp-allowed-urls).

A URL matches an entry when its scheme, host and port are the entry's and its path is the entry's path or
lies below it at a segment boundary (`/mcp` allows `/mcp` and `/mcp/x`, never `/mcpx`). URLs are compared
parsed, never as strings: `http://127.0.0.1:8931@evil/` has userinfo (refused outright, as in entries),
`http://127.0.0.1:89310/` has another port. Paths with dot segments (`/mcp/../admin`, also percent-encoded)
are refused, as a client would resolve them to somewhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
# A host as a URL spells it: a name or IPv4 address, or an IPv6 address in brackets.
_HOST = re.compile(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]")


class NotAllowed(ValueError):
    """A URL the list does not allow, or not a URL the shim would ever reach; the message says why."""


@dataclass(frozen=True)
class UrlPrefix:
    scheme: str
    host: str
    port: int
    path: str  # without a trailing slash: "" is the whole server

    def allows(self, other: UrlPrefix) -> bool:
        if (self.scheme, self.host, self.port) != (other.scheme, other.host, other.port):
            return False
        return other.path == self.path or other.path.startswith(self.path + "/")

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}/"


def parse_url(url: str) -> UrlPrefix:
    """The parts of an http(s) URL; NotAllowed for anything else (userinfo, odd hosts, bad ports...)."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url) or "\\" in url:
        raise NotAllowed("not an http(s) URL")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise NotAllowed("only http and https URLs are allowed")
    if "@" in parts.netloc:
        raise NotAllowed("URLs with user information (user@host) are refused")
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    if not _HOST.fullmatch(host):
        raise NotAllowed("the URL has no valid host")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise NotAllowed("the URL has an invalid port") from None
    segments = parts.path.split("/")
    if any(unquote(s) in (".", "..") for s in segments):
        raise NotAllowed("the URL's path has dot segments")
    return UrlPrefix(scheme, host, port, parts.path.rstrip("/"))


class AllowedUrls:
    """The prefixes, parsed once (a bad entry is a ValueError naming it, at start)."""

    def __init__(self, entries: list[str] | tuple[str, ...] = ()) -> None:
        self.prefixes: list[UrlPrefix] = []
        for entry in entries:
            try:
                self.prefixes.append(parse_url(entry))
            except NotAllowed as error:
                raise ValueError(f"--mcp-allowed-urls entry {entry!r}: {error}") from None

    @classmethod
    def of(cls, text: str | list[str] | None) -> AllowedUrls:
        """From the flag's values: comma-separated, repeatable."""
        values = [text] if isinstance(text, str) else list(text or [])
        return cls([e.strip() for v in values for e in v.split(",") if e.strip()])

    def __bool__(self) -> bool:
        return bool(self.prefixes)

    def match(self, url: str) -> UrlPrefix:
        """The entry that allows `url` (every request to that server is held to it); NotAllowed else."""
        parsed = parse_url(url)
        for prefix in self.prefixes:
            if prefix.allows(parsed):
                return prefix
        raise NotAllowed("the URL is not under any prefix of --mcp-allowed-urls")
