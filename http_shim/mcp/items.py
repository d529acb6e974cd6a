"""The MCP output items and the events that stream them, as the openai SDK types them
(McpListTools, McpCall, McpApprovalRequest; ResponseMcp*Event). The writer (responses/events.py)
calls these with its `event(kind, **fields)`, which numbers each event.

  a listing:   output_item.added, mcp_list_tools.in_progress, mcp_list_tools.completed|failed, output_item.done
  a call:      output_item.added, mcp_call.in_progress, mcp_call_arguments.delta..., mcp_call_arguments.done,
               (the call runs) mcp_call.completed|failed, output_item.done
  an approval request: output_item.added, output_item.done (the response ends; nothing is called)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ids import new_id

Event = Callable[..., bytes]


def list_tools_item(label: str, tools: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
    return {"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": label, "tools": tools, "error": error}


def call_item(label: str, name: str, arguments: str, approval_request_id: str | None = None) -> dict[str, Any]:
    return {"id": new_id("mcp"), "type": "mcp_call", "server_label": label, "name": name, "arguments": arguments,
            "output": None, "error": None, "status": "in_progress", "approval_request_id": approval_request_id}


def approval_request_item(label: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": new_id("mcpr"), "type": "mcp_approval_request", "server_label": label, "name": name,
            "arguments": arguments}


def listing_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    where = {"item_id": item["id"], "output_index": index}
    ended = "failed" if item.get("error") else "completed"
    return [event("response.output_item.added", output_index=index, item={**item, "tools": [], "error": None}),
            event("response.mcp_list_tools.in_progress", **where),
            event(f"response.mcp_list_tools.{ended}", **where),
            event("response.output_item.done", output_index=index, item=item)]


def call_started_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    return [event("response.output_item.added", output_index=index, item={**item, "arguments": ""}),
            event("response.mcp_call.in_progress", item_id=item["id"], output_index=index)]


def arguments_delta_event(event: Event, index: int, item: dict[str, Any], delta: str) -> bytes:
    return event("response.mcp_call_arguments.delta", item_id=item["id"], output_index=index, delta=delta)


def arguments_done_event(event: Event, index: int, item: dict[str, Any]) -> bytes:
    return event("response.mcp_call_arguments.done", item_id=item["id"], output_index=index,
                 arguments=item["arguments"])


def call_ended_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    ended = "failed" if item["status"] == "failed" else "completed"
    return [event(f"response.mcp_call.{ended}", item_id=item["id"], output_index=index),
            event("response.output_item.done", output_index=index, item=item)]


def whole_call_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    """A call already run (approved before the response, or replayed): its events, arguments in one delta."""
    out = call_started_events(event, index, item)
    if item["arguments"]:
        out.append(arguments_delta_event(event, index, item, item["arguments"]))
    return out + [arguments_done_event(event, index, item)] + call_ended_events(event, index, item)


def approval_request_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    return [event("response.output_item.added", output_index=index, item=item),
            event("response.output_item.done", output_index=index, item=item)]


def whole_item_events(event: Event, index: int, item: dict[str, Any]) -> list[bytes]:
    """Any finished MCP item's events (a response's prelude, a stored response replayed)."""
    if item["type"] == "mcp_list_tools":
        return listing_events(event, index, item)
    if item["type"] == "mcp_call":
        return whole_call_events(event, index, item)
    return approval_request_events(event, index, item)


MCP_ITEM_TYPES = ("mcp_list_tools", "mcp_call", "mcp_approval_request")
