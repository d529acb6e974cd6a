"""Remote MCP tools in /v1/responses (`{"type": "mcp", "server_url": ...}`), run by this server:
the allowlist (allowlist.py), the client (client.py: the gevent side; transport.py: the asyncio side;
server.py: a server and a failure), the tool's types (protocol.py), one response's listings, calls and
approvals (run.py) and their items and events (items.py). docs/mcp.md."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_REQUEST_TIMEOUT_S = 120.0
DEFAULT_MAX_RESULT_CHARS = 20_000
ALLOWED_URLS_FLAG, ALLOWED_URLS_ENV = "--mcp-allowed-urls", "CONDUIT_MCP_ALLOWED_URLS"


@dataclass(frozen=True)
class McpConfig:
    allowed_urls: tuple[str, ...] = ()  # URL prefixes (allowlist.py); none: the mcp tool is refused
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S  # one listing or call, connecting included
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # all of one response's MCP operations
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS  # of a tool's output; the rest is cut, with a note
