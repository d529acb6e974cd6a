"""One response's MCP servers: their tools (listed now, or taken from the conversation's earlier
`mcp_list_tools`), the calls the model makes, the approvals asked and answered.

Before the first round (`prepare`): each server is checked against the allowlist (a 400 naming
`tools[i].server_url` and the setting, before any connection), listed unless the conversation has
its listing, and the calls the new input approves (`mcp_approval_response`) are run. Those items
open the response's output (`prelude`). The model is offered each allowed tool as a function (its
name, or LABEL__NAME where two would clash). A call of a tool that needs approval becomes an
`mcp_approval_request` and the response ends there; any other call runs between two rounds
(responses/tool_rounds.py) and the model reads its output or error. Nothing here fails a response:
a server that is down, slow or wrong gives an item with an error.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import gevent

from conduit.v1 import engine_pb2 as pb

from ..errors import invalid
from ..metrics import ShimMetrics
from . import ALLOWED_URLS_ENV, ALLOWED_URLS_FLAG, McpConfig
from .allowlist import AllowedUrls, NotAllowed
from .client import McpClient
from .server import McpFailure, McpServer, http_failure
from .items import approval_request_item, call_item, list_tools_item
from .protocol import McpApprovalRequestItem, McpApprovalResponseItem, McpListToolsItem, McpTool

log = logging.getLogger("http_shim")
KIND = "mcp"  # its calls' kind in the budget
DENIED = "The user did not approve this call; it was not made."
MAX_METRIC_LABELS = 50  # distinct server_label values the metrics keep apart; more count as "other"
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_-]")


class CallBudget(Protocol):
    """The response's budget of hosted tool calls (responses/budget.py)."""

    def left(self, kind: str) -> bool: ...

    def spend(self, kind: str) -> None: ...


@dataclass
class McpFunction:
    """A tool the model is offered: its name to the model, its server, its entry in the listing."""

    model_name: str
    tool: McpTool
    server: McpServer
    entry: dict[str, Any]

    @property
    def name(self) -> str:
        return self.entry["name"]


@dataclass
class McpCall:
    """One call of the model's: its item (shared with the writer), its arguments as they stream."""

    item: dict[str, Any]
    call_id: str
    function: McpFunction
    arguments: list[str] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        return self.function.model_name


class McpSettings:
    """What the routes hold: the configuration, the allowlist, the client and the metrics."""

    def __init__(self, config: McpConfig, metrics: ShimMetrics) -> None:
        self.config = config
        self.allowed = AllowedUrls.of(list(config.allowed_urls))
        self.client = McpClient(config.max_result_chars)
        self.metrics = metrics
        self._labels: set[str] = set()

    def count(self, label: str, operation: str, outcome: str) -> None:
        if label not in self._labels and len(self._labels) >= MAX_METRIC_LABELS:
            label = "other"
        self._labels.add(label)
        self.metrics.mcp_calls.labels(label, operation, outcome).inc()


def _headers(tool: McpTool) -> dict[str, str]:
    headers = dict(tool.headers or {})
    if tool.authorization:
        token = tool.authorization
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    return headers


def _arguments(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class McpRun:
    def __init__(self, settings: McpSettings, tools: list[tuple[int, McpTool]], budget: CallBudget,
                 taken_names: set[str]) -> None:
        """`tools`: the request's mcp tools and their places; `taken_names`: the request's other functions."""
        self.settings = settings
        self.budget = budget
        self.deadline = time.monotonic() + settings.config.request_timeout_s
        self.servers: dict[str, tuple[int, McpTool, McpServer]] = {}
        for k, tool in tools:
            self.servers[tool.server_label] = (k, tool, self._allowed(k, tool))
        self.taken_names = set(taken_names)
        self.functions: dict[str, McpFunction] = {}  # by the model's name
        self.prelude: list[dict[str, Any]] = []  # items before the model's: listings, approved calls
        self.calls: list[McpCall] = []
        self.pending: list[McpCall] = []  # called in this round, not yet run

    def _allowed(self, k: int, tool: McpTool) -> McpServer:
        if not self.settings.allowed:
            raise invalid(f"MCP tools are off on this server: an operator allows MCP servers with "
                          f"{ALLOWED_URLS_FLAG} (or {ALLOWED_URLS_ENV}).", f"tools[{k}].server_url")
        if any(t.server_label == tool.server_label for _, t, _ in self.servers.values()):
            raise invalid(f"Two mcp tools have the server_label '{tool.server_label}'.", f"tools[{k}].server_label")
        try:
            prefix = self.settings.allowed.match(tool.server_url)
        except NotAllowed as error:
            raise invalid(f"The MCP server URL is not allowed on this server: {error} ({ALLOWED_URLS_FLAG}, "
                          f"{ALLOWED_URLS_ENV}).", f"tools[{k}].server_url") from None
        return McpServer(tool.server_label, tool.server_url, prefix, _headers(tool))

    def _time_left(self) -> float:
        return min(self.settings.config.call_timeout_s, self.deadline - time.monotonic())

    # ------------------------------------------------------------------ before the first round

    def prepare(self, inherited: list[Any], new: list[Any]) -> None:
        """Tools from the conversation or listed now (the servers at once); the approved calls run (see the
        module's docstring)."""
        known = {i.server_label: i.tools for i in inherited if isinstance(i, McpListToolsItem) and not i.error}
        listing = {label: gevent.spawn(self._list, tool, server)
                   for label, (_, tool, server) in self.servers.items() if label not in known}
        gevent.joinall(list(listing.values()))
        for label, (_, tool, server) in self.servers.items():
            if label in listing:
                item = listing[label].get()
                self.prelude.append(item)
                entries = item["tools"]
            else:
                entries = known[label]
            for entry in entries:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str) \
                        and tool.allows(entry["name"], entry.get("annotations")):
                    self._offer(tool, server, entry)
        requests = {i.id: i for i in inherited if isinstance(i, McpApprovalRequestItem)}
        for k, item in enumerate(new):
            if isinstance(item, McpApprovalResponseItem):
                self._answer(k, item, requests.get(item.approval_request_id))

    def _list(self, tool: McpTool, server: McpServer) -> dict[str, Any]:
        """The server's `mcp_list_tools` item: the tools `allowed_tools` lets through, or the error."""
        try:
            timeout = self._time_left()
            if timeout <= 0:
                raise http_failure("timeout", 504, "The time for this response's MCP calls is spent.")
            listed = self.settings.client.list_tools(server, timeout)
            self.settings.count(server.label, "list_tools", "ok")
        except McpFailure as failure:
            self.settings.count(server.label, "list_tools", failure.outcome)
            log.info("MCP server %s: listing failed (%s)", server.label, failure.outcome)
            return list_tools_item(server.label, [], failure.message)
        return list_tools_item(server.label, [t for t in listed if tool.allows(t["name"], t.get("annotations"))],
                               None)

    def _offer(self, tool: McpTool, server: McpServer, entry: dict[str, Any]) -> None:
        name = _NOT_NAME.sub("_", entry["name"])[:64] or "tool"
        if name in self.taken_names or name in self.functions:
            name = f"{tool.server_label}__{name}"[:64]
        while name in self.taken_names or name in self.functions:
            name = name[:60] + f"_{len(self.functions)}"
        self.functions[name] = McpFunction(name, tool, server, entry)

    def _answer(self, k: int, answer: McpApprovalResponseItem, asked: McpApprovalRequestItem | None) -> None:
        if asked is None:
            raise invalid(f"'approval_request_id' names no mcp_approval_request of the conversation "
                          f"('{answer.approval_request_id}').", f"input[{k}].approval_request_id")
        function = self.function_of(asked.server_label, asked.name)
        if function is None:
            raise invalid(f"The approved call's server '{asked.server_label}' or tool '{asked.name}' is not among "
                          f"this request's mcp tools.", f"input[{k}]")
        if not answer.approve:
            self.settings.count(asked.server_label, "call_tool", "denied")
            return
        call = McpCall(call_item(asked.server_label, asked.name, asked.arguments, asked.id), asked.id, function,
                       [asked.arguments])
        self.budget.spend(KIND)
        self._call(call)
        self.prelude.append(call.item)

    def function_of(self, label: str, name: str) -> McpFunction | None:
        return next((f for f in self.functions.values() if f.tool.server_label == label and f.name == name), None)

    def offered(self) -> list[pb.Tool]:
        out = []
        for f in self.functions.values():
            description = f.entry.get("description") or ""
            if f.tool.server_description:
                description = f"({f.tool.server_label}: {f.tool.server_description}) {description}".strip()
            schema = f.entry.get("input_schema") or {"type": "object", "properties": {}}
            out.append(pb.Tool(name=f.model_name, description=description, parameters_json=json.dumps(schema)))
        return out

    def forced(self, label: str, name: str | None) -> list[str]:
        """The model's names of a server's tools (`name`: that one only); a 400 naming tool_choice if none."""
        names = [f.model_name for f in self.functions.values()
                 if f.tool.server_label == label and (name is None or f.name == name)]
        if not names:
            what = f"tool '{name}' of MCP server '{label}'" if name else f"MCP server '{label}' with tools"
            raise invalid(f"'tool_choice' names the {what}, which 'tools' does not offer.", "tool_choice")
        return names

    # ------------------------------------------------------------------ the model's calls

    def answers(self, model_name: str) -> bool:
        return model_name in self.functions

    def names(self) -> set[str]:
        return set(self.functions)

    def begin(self, call_id: str, model_name: str) -> dict[str, Any]:
        """A call's item: an approval request when the tool needs one, else a call that runs after the round."""
        function = self.functions[model_name]
        label = function.tool.server_label
        if function.tool.needs_approval(function.name, function.entry.get("annotations")):
            self.settings.count(label, "call_tool", "approval_requested")
            return approval_request_item(label, function.name, "")
        call = McpCall(call_item(label, function.name, ""), call_id, function)
        self.calls.append(call)
        self.pending.append(call)
        return call.item

    def call_of(self, item_id: str) -> McpCall:
        return next(c for c in self.calls if c.item["id"] == item_id)

    def can_call_again(self) -> bool:
        return self.budget.left(KIND)

    def run_pending(self) -> None:
        for call in self.pending:
            if self.budget.left(KIND):
                self.budget.spend(KIND)
                self._call(call)
            else:
                self._fail(call, http_failure("max_tool_calls", 429, "max_tool_calls was reached; not called."))

    def _call(self, call: McpCall) -> None:
        text = "".join(call.arguments) or "{}"
        call.item["arguments"] = text
        arguments = _arguments(text)
        if arguments is None:
            failure = McpFailure("bad_arguments", {"type": "mcp_protocol_error", "code": -32602,
                                                   "message": "The model's arguments are not a JSON object."})
            return self._fail(call, failure)
        timeout = self._time_left()
        if timeout <= 0:
            return self._fail(call, http_failure("timeout", 504, "The time for this response's MCP calls is spent."))
        try:
            call.item["output"] = self.settings.client.call_tool(call.function.server, call.function.name,
                                                                  arguments, timeout)
        except McpFailure as failure:
            return self._fail(call, failure)
        call.item["status"] = "completed"
        self.settings.count(call.function.server.label, "call_tool", "ok")

    def _fail(self, call: McpCall, failure: McpFailure) -> None:
        log.info("MCP call %s on %s failed (%s)", call.function.name, call.function.server.label, failure.outcome)
        self.settings.count(call.function.server.label, "call_tool", failure.outcome)
        call.item["status"] = "failed"
        call.item["error"] = failure.error

    def tool_answer(self, call: McpCall) -> str:
        return tool_answer_of(call.item)


def tool_answer_of(item: dict[str, Any]) -> str:
    """What the model reads of a call (run now or earlier in the conversation)."""
    if item.get("status") != "failed" and item.get("error") is None:
        return item.get("output") or ""
    error = item.get("error") or {}
    if isinstance(error, dict):
        detail = error.get("message") or json.dumps(error.get("content"))
    else:
        detail = str(error)
    return f"The tool call failed: {detail}"

