"""The /v1/responses routes: create (whole or streamed), retrieve (also replayed as events),
delete, list input items, cancel.

Generation goes through the shared relay (drain, heartbeats, disconnect -> cancel, first answer
before the 200); answers go into the response store when `store` is on (store.py). Responses in
flight are known to this process only (for GET and cancel), as the store is this shim's own.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, after_this_request, request

from .. import sse
from ..context import ShimContext
from ..engine_stream import EngineStream
from ..errors import APIError, invalid
from ..protocol.base import parse
from ..protocol.listing import ASCII_INTEGER
from ..web import json_response, read_body, request_id
from ..auth import tenant
from ..retrieval.routes import store_expired
from .events import CANCELLED_CODE, ResponseEvents
from ..mcp.protocol import McpApprovalResponseItem, McpTool
from ..mcp.run import McpRun, McpSettings
from .budget import CallBudget
from .file_search import SEARCH_NAME, FileSearchRun
from .objects import ResponseSkeleton, new_id
from .protocol import MAX_LIST_LIMIT, FunctionTool, NamespaceTool, ResponseRequest
from .request import ResponsesRequest, build_request, inherited_items, new_items, qualified_name
from .tool_rounds import ToolRounds
from .store import ResponseStore, StoredResponse

if TYPE_CHECKING:
    from ..retrieval import Retrieval

log = logging.getLogger("http_shim")
RESPONSES_ROUTE = "/v1/responses"
NOT_OFFERED_HEADER = "Conduit-Tools-Not-Offered"  # hosted tool types accepted and not offered (request.py)


@dataclass
class _InFlight:
    stream: EngineStream
    skeleton: ResponseSkeleton
    owner: str  # the tenant that created it: the only one that sees or cancels it


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", param, None)


def _add_header(name: str, value: str) -> None:
    """A header on this request's answer, whichever way it is answered."""
    def add(answer: Response) -> Response:
        answer.headers[name] = value
        return answer
    after_this_request(add)


class ResponsesRoutes:
    """The routes' state: the store (None: nothing is kept, every `store: true` answer is forgotten and
    chains are refused) and the responses in flight in this process (for GET and cancel)."""

    def __init__(self, ctx: ShimContext, store: ResponseStore | None, retrieval: Retrieval | None = None,
                 mcp: McpSettings | None = None) -> None:
        self.ctx = ctx
        self.store = store
        self.retrieval = retrieval  # what file_search searches with (None: no store, no vector stores)
        self.mcp = mcp  # the MCP client and its allowlist (None: the mcp tool is refused)
        self.in_flight: dict[str, _InFlight] = {}

    def stored(self, response_id: str, param: str | None = None) -> StoredResponse:
        found = self.store.get(response_id, tenant()) if self.store is not None else None
        if found is None:
            raise _not_found(response_id, param)
        return found

    def create_response(self) -> Response:
        request = parse(ResponseRequest, read_body(), limits=self.ctx.limits)
        inherited: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            prior = self.stored(request.previous_response_id, "previous_response_id")
            inherited = prior.context + prior.response["output"]
        budget = CallBudget(request.max_tool_calls)
        mcp = self._mcp(request, inherited, budget)
        parsed = build_request(request, request_id(), self.ctx.limits, inherited, mcp)
        if parsed.tools.not_offered:
            _add_header(NOT_OFFERED_HEADER, ", ".join(parsed.tools.not_offered))
        searches = self._file_search(parsed, budget)
        runs = [run for run in (searches, mcp) if run is not None]
        chain = None
        if runs:
            def chain(first: Any, start: Any) -> ToolRounds:
                return ToolRounds(first, parsed.generate, runs, lambda r: start([r]))
        try:
            model, stream = self.ctx.relay.open(parsed.model, [parsed.generate], chain)
        except APIError as error:
            raise parsed.engine_error(error) from None
        skeleton = ResponseSkeleton(new_id("resp"), model, parsed.echo, parsed.tools.namespaced)
        self.in_flight[skeleton.id] = _InFlight(stream, skeleton, tenant())
        writer = ResponseEvents(skeleton, parsed.logprobs, functools.partial(self._keep, parsed, tenant()),
                                parsed.engine_error, searches, mcp)
        if runs:
            stream.round_items = writer.round_items
        try:
            if not parsed.stream:
                return self._whole(parsed, stream, skeleton, writer)
            answer = self.ctx.relay.sse(stream, writer)
            answer.call_on_close(lambda: self.in_flight.pop(skeleton.id, None))
            return answer
        except APIError as error:
            self.in_flight.pop(skeleton.id, None)
            raise parsed.engine_error(error) from None

    def _mcp(self, request: ResponseRequest, inherited: list[dict[str, Any]], budget: CallBudget) -> McpRun | None:
        """The mcp tools' run, prepared: servers allowed (400 else, before any connection), tools listed or
        taken from the conversation, approved calls run (mcp/run.py)."""
        tools = [(k, t) for k, t in enumerate(request.tools or []) if isinstance(t, McpTool)]
        if not tools:
            answers = [k for k, i in enumerate(new_items(request)) if isinstance(i, McpApprovalResponseItem)]
            if answers:
                raise invalid("An mcp_approval_response needs the mcp tool of its server in 'tools'.",
                              f"input[{answers[0]}]")
            return None
        if self.mcp is None:
            raise invalid("MCP tools are not served here.", f"tools[{tools[0][0]}]")
        functions = {t.name for t in request.tools or [] if isinstance(t, FunctionTool)}
        functions |= {qualified_name(t.name, f.name) for t in request.tools or [] if isinstance(t, NamespaceTool)
                      for f in t.tools}
        run = McpRun(self.mcp, tools, budget, functions | {SEARCH_NAME})
        run.prepare(inherited_items(inherited), new_items(request))
        return run

    def _file_search(self, parsed: ResponsesRequest, budget: CallBudget) -> FileSearchRun | None:
        """The file_search tool's run, once its vector stores are known to be the caller's (404 else)."""
        tool = parsed.tools.file_search
        if tool is None:
            return None
        path = parsed.tools.paths[[t.name for t in parsed.tools.offered].index(SEARCH_NAME)] \
            if SEARCH_NAME in [t.name for t in parsed.tools.offered] else "tools"
        if self.retrieval is None:
            raise invalid("The file_search tool needs vector stores, which this server keeps none of "
                          "(--responses-store-dir '').", path)
        for k, store_id in enumerate(tool.vector_store_ids):
            store = self.retrieval.catalog.store(tenant(), store_id)
            if store is None:
                raise APIError(404, f"No vector store found with id '{store_id}'.", "invalid_request_error",
                               f"{path}.vector_store_ids[{k}]", None)
            if store["status"] == "expired":
                raise store_expired(store_id, f"{path}.vector_store_ids[{k}]")
        users = [m.content for m in parsed.generate.chat.messages if m.role == "user"]
        return FileSearchRun(self.retrieval, tool, parsed.include_results, budget, request_id(),
                             users[-1] if users else "")

    def _keep(self, parsed: ResponsesRequest, owner: str, response: dict[str, Any]) -> None:
        """A finished response: out of the in-flight table, into the store (as `owner`'s) when asked."""
        self.in_flight.pop(response["id"], None)
        if parsed.store and self.store is not None:
            self.store.put(response, parsed.context, owner)

    def _whole(self, parsed: ResponsesRequest, stream: EngineStream, skeleton: ResponseSkeleton,
               writer: ResponseEvents) -> Response:
        """The streamed answer's final object, from the same writer (its events are dropped)."""
        try:
            if not self.ctx.relay.collect(stream, writer.on_response):
                self.in_flight.pop(skeleton.id, None)
                return Response(status=499)
            writer.finish()  # its on_end keeps the final object
            response = writer.final
        except APIError as error:
            if error.code != CANCELLED_CODE:
                raise
            response = skeleton.build("cancelled", [])
            self._keep(parsed, tenant(), response)
        return json_response(response)

    def _running(self, response_id: str) -> _InFlight | None:
        running = self.in_flight.get(response_id)
        return running if running is not None and running.owner == tenant() else None

    def get_response(self, response_id: str) -> Response:
        if self._running(response_id) is not None:
            response = self.in_flight[response_id].skeleton.build("in_progress", [])
        else:
            response = self.stored(response_id).response
        if request.args.get("stream", "false").lower() != "true":
            return json_response(response)
        after = request.args.get("starting_after", "-1")
        if not ASCII_INTEGER.fullmatch(after):
            raise invalid("'starting_after' must be an integer.", "starting_after")
        events = ResponseEvents.replay(response) if response["status"] != "in_progress" else []
        body = b"".join(e for k, e in enumerate(events) if k > int(after))
        return Response(body, 200, sse.HEADERS, content_type=sse.CONTENT_TYPE)

    def delete_response(self, response_id: str) -> Response:
        if self.store is None or not self.store.delete(response_id, tenant()):
            raise _not_found(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})

    def list_input_items(self, response_id: str) -> Response:
        items = self.stored(response_id).context
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid(f"'order' must be 'asc' or 'desc', got '{order}'.", "order")
        limit_text = request.args.get("limit", "20")
        if not ASCII_INTEGER.fullmatch(limit_text) or not 1 <= int(limit_text) <= MAX_LIST_LIMIT:
            raise invalid(f"'limit' must be an integer between 1 and {MAX_LIST_LIMIT}.", "limit")
        ordered = items if order == "asc" else items[::-1]
        after = request.args.get("after")
        if after is not None:
            ids = [item.get("id") for item in ordered]
            if after not in ids:
                raise invalid(f"'after' names no input item of response '{response_id}'.", "after")
            ordered = ordered[ids.index(after) + 1:]
        page = ordered[: int(limit_text)]
        return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > len(page)})

    def cancel_response(self, response_id: str) -> Response:
        running = self._running(response_id) and self.in_flight.pop(response_id, None)
        if running is None:
            status = self.stored(response_id).response["status"]
            raise invalid(f"Cannot cancel response '{response_id}': only a response in progress can be cancelled; "
                          f"this one is {status}.", None, "invalid_response_status")
        running.stream.interrupt(APIError(499, "The response was cancelled.", "invalid_request_error", None,
                                          CANCELLED_CODE))
        log.info("response %s cancelled", response_id)
        return json_response(running.skeleton.build("cancelled", []))


def register_responses(app: Flask, ctx: ShimContext, store: ResponseStore | None,
                       retrieval: Retrieval | None = None, mcp: McpSettings | None = None) -> None:
    routes = ResponsesRoutes(ctx, store, retrieval, mcp)
    app.post(RESPONSES_ROUTE)(routes.create_response)
    app.get(f"{RESPONSES_ROUTE}/<response_id>")(routes.get_response)
    app.delete(f"{RESPONSES_ROUTE}/<response_id>")(routes.delete_response)
    app.get(f"{RESPONSES_ROUTE}/<response_id>/input_items")(routes.list_input_items)
    app.post(f"{RESPONSES_ROUTE}/<response_id>/cancel")(routes.cancel_response)
