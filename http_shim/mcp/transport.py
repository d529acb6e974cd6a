"""The asyncio side of the MCP client (client.py runs it in a pool thread): the transports, the checks
on every request, and the failures classified. Imported at the first MCP operation (`mcp` takes ~0.4 s
to import)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PaginatedRequestParams

from .allowlist import NotAllowed, parse_url
from .server import McpFailure, McpServer, http_failure


def _import_httpcore_without_a_broken_trio() -> None:
    """httpx2 imports httpcore2 at its first client, and httpcore2 imports trio wherever it is installed; under
    gevent's patches trio's import fails (no `select.epoll`; from a pool thread, its `ldconfig` subprocess), and
    every MCP call failed with it. The clients here run on asyncio: where trio cannot be imported, it is marked
    absent (an ImportError, which httpcore2 expects), at the shim's start."""
    try:
        import trio  # noqa: F401
    except Exception:  # noqa: BLE001 - whatever broke it
        for name in [n for n in sys.modules if n == "trio" or n.startswith("trio.")]:
            del sys.modules[name]
        sys.modules["trio"] = None  # type: ignore[assignment]
    import httpcore2  # noqa: F401


_import_httpcore_without_a_broken_trio()

log = logging.getLogger("http_shim")
# httpx2 logs each request (and its URL) at INFO: not the shim's story to tell.
logging.getLogger("httpx2").setLevel(logging.WARNING)
NOT_STREAMABLE = (400, 404, 405)  # the answers to a first POST after which SSE is tried
MAX_LIST_PAGES = 20  # of a server's tools/list (a server may not page forever)
T = TypeVar("T")


class _Refused(Exception):
    """A request or redirect the client would not follow (raised inside httpx2's hooks)."""


@dataclass
class _Attempt:
    """What one transport's requests met: the first status, and whether SSE should be tried."""

    first_status: int | None = None


def _http_client(server: McpServer, timeout_s: float, attempt: _Attempt, headers: dict[str, str] | None = None,
                 timeout: Any = None, auth: Any = None) -> httpx2.AsyncClient:
    async def check_request(request: httpx2.Request) -> None:
        """The server's own origin only (its URL's path was checked before connecting; the SSE transport
        posts to an endpoint the server names, on that origin)."""
        try:
            target = parse_url(str(request.url))
        except NotAllowed:
            target = None
        prefix = server.prefix
        if target is None or (target.scheme, target.host, target.port) != (prefix.scheme, prefix.host, prefix.port):
            raise _Refused("the server sent the client to a URL outside --mcp-allowed-urls")

    async def check_response(response: httpx2.Response) -> None:
        if attempt.first_status is None:
            attempt.first_status = response.status_code
        if 300 <= response.status_code < 400:
            raise _Refused(f"the server answered with a redirect ({response.status_code}), which is not followed")

    return httpx2.AsyncClient(headers={**server.headers, **(headers or {})}, follow_redirects=False,
                              timeout=httpx2.Timeout(timeout_s), auth=auth,
                              event_hooks={"request": [check_request], "response": [check_response]})


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


def _failure(error: BaseException, attempt: _Attempt) -> McpFailure:
    """The failure an exception (or an anyio group of them) stands for."""
    leaves = _leaves(error)
    for leaf in leaves:
        if isinstance(leaf, McpFailure):
            return leaf
        if isinstance(leaf, _Refused):
            return http_failure("refused", 403, str(leaf))
        if isinstance(leaf, (TimeoutError, httpx2.TimeoutException)):
            return http_failure("timeout", 504, "The MCP server did not answer in time.")
        if isinstance(leaf, httpx2.ConnectError):
            return http_failure("unreachable", 502, "The MCP server could not be reached.")
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            return http_failure("http_error", status, f"The MCP server answered HTTP {status}.")
    if attempt.first_status is not None and attempt.first_status >= 400:
        status = attempt.first_status
        return http_failure("http_error", status, f"The MCP server answered HTTP {status}.")
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            return McpFailure("protocol_error", {"type": "mcp_protocol_error", "code": leaf.code,
                                                 "message": leaf.message})
    first = leaves[0]
    log.info("MCP operation failed: %s", type(first).__name__)  # the type only: messages may hold URLs
    return McpFailure("protocol_error", {"type": "mcp_protocol_error", "code": -32603,
                                         "message": f"The MCP exchange failed ({type(first).__name__})."})


async def _streamable(server: McpServer, timeout_s: float, op: Callable[[ClientSession], Awaitable[T]],
                      attempt: _Attempt) -> T:
    async with _http_client(server, timeout_s, attempt) as http:
        async with streamable_http_client(server.url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1], read_timeout_seconds=timeout_s) as session:
                await session.initialize()
                return await op(session)


async def _sse(server: McpServer, timeout_s: float, op: Callable[[ClientSession], Awaitable[T]],
               attempt: _Attempt) -> T:
    def factory(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> httpx2.AsyncClient:
        return _http_client(server, timeout_s, attempt, headers, timeout, auth)

    async with sse_client(server.url, timeout=timeout_s, sse_read_timeout=timeout_s,
                          httpx_client_factory=factory) as streams:
        async with ClientSession(streams[0], streams[1], read_timeout_seconds=timeout_s) as session:
            await session.initialize()
            return await op(session)


# The URLs whose server answered over SSE only (the next operation starts there); bounded, shared by threads.
_SSE_ONLY: dict[str, None] = {}
MAX_REMEMBERED = 256


async def _run(server: McpServer, timeout_s: float, op: Callable[[ClientSession], Awaitable[T]]) -> T:
    """`op` on a session with the server within `timeout_s`: streamable HTTP, else SSE (the module's docstring)."""
    try:
        with anyio.fail_after(timeout_s):
            return await _transports(server, timeout_s, op)
    except TimeoutError:
        raise http_failure("timeout", 504, "The MCP server did not answer in time.") from None


def _cancelled(error: BaseException) -> bool:
    """The time limit's cancellation (fail_after turns it into TimeoutError), not a failure to classify."""
    return any(isinstance(leaf, asyncio.CancelledError) for leaf in _leaves(error))


async def _transports(server: McpServer, timeout_s: float, op: Callable[[ClientSession], Awaitable[T]]) -> T:
    if server.url not in _SSE_ONLY:
        attempt = _Attempt()
        try:
            return await _streamable(server, timeout_s, op, attempt)
        except McpFailure:
            raise
        except BaseException as error:  # noqa: BLE001 - anyio's groups; classified below
            if _cancelled(error):
                raise
            if attempt.first_status not in NOT_STREAMABLE:
                raise _failure(error, attempt) from None
    attempt = _Attempt()
    try:
        result = await _sse(server, timeout_s, op, attempt)
    except McpFailure:
        raise
    except BaseException as error:  # noqa: BLE001
        if _cancelled(error):
            raise
        _SSE_ONLY.pop(server.url, None)
        raise _failure(error, attempt) from None
    if len(_SSE_ONLY) >= MAX_REMEMBERED:
        _SSE_ONLY.clear()
    _SSE_ONLY[server.url] = None
    return result


def _tool_entry(tool: Any) -> dict[str, Any]:
    """A listed tool as `mcp_list_tools.tools` holds it."""
    annotations = tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else None
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema,
            "annotations": annotations}


def _content_text(content: list[Any]) -> str:
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json", exclude_none=True)))
    return "\n".join(parts)


async def list_tools(session: ClientSession) -> list[dict[str, Any]]:
    tools, cursor = [], None
    for _ in range(MAX_LIST_PAGES):
        page = await session.list_tools(params=None if cursor is None else PaginatedRequestParams(cursor=cursor))
        tools += [_tool_entry(t) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def call_tool(name: str, arguments: dict[str, Any]) -> Callable[[ClientSession], Awaitable[tuple[str, Any]]]:
    """The call as an operation; it gives (text, None) or (None, the error's content) when the tool failed."""
    async def calling(session: ClientSession) -> tuple[str | None, Any]:
        result = await session.call_tool(name, arguments)
        if result.is_error:
            return None, [c.model_dump(mode="json", exclude_none=True) for c in result.content]
        text = _content_text(result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        return text, None

    return calling


def run_in_thread(server: McpServer, timeout_s: float, op: Callable[[ClientSession], Awaitable[T]]) -> T | McpFailure:
    """Runs in a pool thread, on an event loop of its own: a failure comes back as a value (raised there,
    gevent's hub would print it)."""
    try:
        return asyncio.run(_run(server, timeout_s, op))
    except McpFailure as failure:
        return failure
    except BaseException as error:  # noqa: BLE001 - whatever it was, the response goes on
        return _failure(error, _Attempt())
