"""The shim's MCP client: lists a server's tools and calls one, with the `mcp` package (2.x).

`mcp` is asyncio (anyio) code and the shim runs on gevent: each operation runs `asyncio.run` in a real
OS thread of a pool of this module's own (gevent's ThreadPool), so the greenlet that waits for it
yields to the others, and a thread's event loop sees no greenlets (transport.py holds that side). Each
operation opens its own session (connect, initialize, the request, close): nothing outlives it.

Transport: streamable HTTP first; a server that answers its first POST with 400, 404 or 405 (the
MCP specification's sign of an older server) is then tried with the HTTP+SSE transport at the same
URL (as Llama Stack does). Every request the client makes is held to the origin (scheme, host, port)
of the allowlist entry that allowed the URL (whose path was checked before connecting: the SSE
transport posts to an endpoint the server names on its origin), and no redirect is followed.

Failures come back as McpFailure, shaped as OpenAI's `mcp_call.error` (http_error,
mcp_protocol_error, mcp_tool_execution_error). Headers (the caller's secrets) are never logged.
"""

from __future__ import annotations

from typing import Any

from gevent import Timeout
from gevent.threadpool import ThreadPool

from .server import McpFailure, McpServer, http_failure

POOL_THREADS = 8  # MCP operations running at once; more wait for a thread
GRACE_S = 5.0  # past an operation's limit, the waiting greenlet stops waiting for its thread


class McpClient:
    """Lists and calls, each within `timeout_s` (connecting included); outputs are cut at
    `max_result_chars` with a note saying so."""

    def __init__(self, max_result_chars: int) -> None:
        self.max_result_chars = max_result_chars
        self._pool: ThreadPool | None = None

    def _blocking(self, server: McpServer, timeout_s: float, op: Any) -> Any:
        from . import transport  # noqa: PLC0415 - `mcp` is imported at the first operation

        if self._pool is None:
            self._pool = ThreadPool(POOL_THREADS)
        try:
            outcome = self._pool.spawn(transport.run_in_thread, server, timeout_s, op).get(
                timeout=timeout_s + GRACE_S)
        except Timeout:
            raise http_failure("timeout", 504, "The MCP server did not answer in time.") from None
        if isinstance(outcome, McpFailure):
            raise outcome
        return outcome

    def list_tools(self, server: McpServer, timeout_s: float) -> list[dict[str, Any]]:
        from . import transport  # noqa: PLC0415

        return self._blocking(server, timeout_s, transport.list_tools)

    def call_tool(self, server: McpServer, name: str, arguments: dict[str, Any], timeout_s: float) -> str:
        """The tool's output as text; McpFailure when the call or the tool failed."""
        from . import transport  # noqa: PLC0415

        text, error_content = self._blocking(server, timeout_s, transport.call_tool(name, arguments))
        if error_content is not None:
            raise McpFailure("tool_error", {"type": "mcp_tool_execution_error", "content": error_content})
        return self.truncated(text)

    def truncated(self, text: str) -> str:
        if len(text) <= self.max_result_chars:
            return text
        cut = len(text) - self.max_result_chars
        return text[: self.max_result_chars] + f"\n[truncated by the server: {cut} more characters]"
