"""The Responses API's event stream, exactly as the openai SDK's stream helper and the Agents SDK
read it (DESIGN.md, "The agent APIs"):

  response.created, response.in_progress,
  per reasoning item (a reasoning model's thinking): output_item.added, content_part.added,
                    reasoning_text.delta..., reasoning_text.done, content_part.done, output_item.done
  per message item: output_item.added, content_part.added, output_text.delta..., output_text.done,
                    content_part.done, output_item.done
  per function call: output_item.added, function_call_arguments.delta..., .done, output_item.done
  per hosted tool's item (file_search_call; MCP's: mcp/items.py): theirs, the calls run between rounds
  one terminal event: response.completed | response.incomplete | (error, then response.failed)

Items come one at a time (each done before the next is added) in the order the model wrote them: a
message may follow calls (the prose after them).
Each event's `event:` line equals its `type`; `sequence_number` counts every event from 0;
`output_index` is the item's place in `output`; `content_index` is the part's place in its item.
The same writer replays a stored response (GET /v1/responses/{id}?stream=true, `replay`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conduit.v1 import engine_pb2 as pb
from conduit_common.results import Usage

from .. import sse
from ..errors import APIError
from ..protocol.logprobs import token_logprobs
from ..stream_fold import (ChoiceEnd, Event, Finish, ReasoningDelta, StreamFold, TextDelta, ToolCallArguments,
                           ToolCallStart)
from ..mcp import items as mcp_items
from .file_search import FileSearchRun
from .tool_rounds import RAN, RUNNING
from .objects import (ResponseSkeleton, function_call_item, message_item, new_id, reasoning_item, text_part,
                      usage_object)

if TYPE_CHECKING:
    from ..mcp.run import McpRun

# The code of the error a cancel (POST /v1/responses/{id}/cancel) ends a generation with.
CANCELLED_CODE = "response_cancelled"


@dataclass
class _Item:
    """An output item being written: reasoning or a message (text), or a function call (arguments)."""

    output_index: int
    item: dict[str, Any]
    pieces: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


class ResponseEvents:
    """An EventWriter (relay.py) for /v1/responses, and so the whole answer too (the relay's collect):
    `on_end(response)` receives the final object (completed, incomplete, failed or cancelled), e.g. to
    store it, and `final` keeps it; `named(error)` gives an engine error the Responses name of its field."""

    heartbeat = sse.HEARTBEAT

    def __init__(self, skeleton: ResponseSkeleton, logprobs: bool,
                 on_end: Callable[[dict[str, Any]], None] = lambda _: None,
                 named: Callable[[APIError], APIError] = lambda error: error,
                 searches: FileSearchRun | None = None, mcp: McpRun | None = None) -> None:
        """`searches`, `mcp`: the runs of the hosted tools the request has (file_search.py, mcp/run.py)."""
        self._skeleton = skeleton
        self._searches = searches
        self._mcp = mcp
        self._earlier_usage: list[Usage] = []  # of the rounds before a search (file_search.py)
        self._round_start = 0  # the first item of the current round
        self._named = named
        self._logprobs = logprobs
        self._on_end = on_end
        self._sequence = 0
        self._started = False
        self._items: list[_Item] = []
        # The open items: "reasoning", "message", and each function call by the engine's call index.
        self._open: dict[str | int, _Item] = {}
        # Logprobs of tokens that wrote no text yet (half a character): the message's if its text follows.
        self._unwritten: list[dict[str, Any]] = []
        self._fold = StreamFold()
        self._status = "completed"  # incomplete once the engine says the output limit cut the answer
        self.final: dict[str, Any] = {}

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse.named_event(data)

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        snapshot = self._skeleton.build("in_progress", [])
        out = [self._event("response.created", response=snapshot),
               self._event("response.in_progress", response=snapshot)]
        for item in self._mcp.prelude if self._mcp is not None else []:  # listed, or approved and run, before
            out += self._whole_mcp_item(item)
        self._round_start = len(self._items)
        return out

    def _whole_mcp_item(self, item: dict[str, Any]) -> list[bytes]:
        """A finished MCP item (a response's prelude, a replay): its events, and its place in the output."""
        entry = _Item(len(self._items), item, done=True)
        self._items.append(entry)
        return mcp_items.whole_item_events(self._event, entry.output_index, item)

    @staticmethod
    def _where(entry: _Item) -> dict[str, Any]:
        return {"item_id": entry.item["id"], "output_index": entry.output_index, "content_index": 0}

    def _add(self, key: str | int, item: dict[str, Any], part: dict[str, Any] | None = None,
             shown: bool = True) -> list[bytes]:
        """A new output item, open under `key`: its added event (unless not `shown` yet), then its content
        part's when it has one."""
        entry = self._open[key] = _Item(len(self._items), item)
        self._items.append(entry)
        if not shown:
            return []
        out = [self._event("response.output_item.added", output_index=entry.output_index, item=item)]
        if part is not None:
            out.append(self._event("response.content_part.added", **self._where(entry), part=part))
        return out

    def _close(self, status: str, *keys: str | int) -> list[bytes]:
        """Ends the items open under `keys`, in that order, each in its final form with `status`: a reasoning
        or message item's text.done and content_part.done, a call's arguments.done; then output_item.done."""
        out = []
        for entry in [self._open.pop(key) for key in keys if key in self._open]:
            item, text = entry.item, "".join(entry.pieces)
            if item["type"] == "file_search_call":
                continue  # searched between rounds, then done (_hosted_step)
            if item["type"] == "mcp_call":
                item["arguments"] = text  # the call runs between rounds, then is done (_hosted_step)
                out.append(mcp_items.arguments_done_event(self._event, entry.output_index, item))
                continue
            if item["type"] == "mcp_approval_request":
                item["arguments"] = text
                entry.done = True
                out += mcp_items.approval_request_events(self._event, entry.output_index, item)
                continue
            if item["type"] == "function_call":
                entry.item = {**item, "arguments": text, "status": status}
                out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                       output_index=entry.output_index, name=item["name"], arguments=text))
            else:
                if item["type"] == "reasoning":
                    entry.item = reasoning_item(item["id"], status, text, self._skeleton.summarized)
                    fields = {}
                else:
                    cited = self._searches.citations(text) if self._searches is not None else []
                    entry.item = message_item(item["id"], status, [text_part(text, entry.logprobs, cited)])
                    fields = {"logprobs": entry.logprobs}
                part, where = entry.item["content"][0], self._where(entry)
                out += [self._event("response.output_text.annotation.added", **where, annotation_index=k,
                                    annotation=annotation) for k, annotation in enumerate(part.get("annotations") or [])]
                out += [self._event(f"response.{part['type']}.done", **where, text=text, **fields),
                        self._event("response.content_part.done", **where, part=part)]
            entry.done = True
            out.append(self._event("response.output_item.done", output_index=entry.output_index, item=entry.item))
        return out

    def _reasoning_delta(self, text: str, item_id: str | None = None) -> list[bytes]:
        out = []
        if "reasoning" not in self._open:
            item = reasoning_item(item_id or new_id("rs"), "in_progress", None)
            out = self._add("reasoning", item, {"type": "reasoning_text", "text": ""})
        entry = self._open["reasoning"]
        entry.pieces.append(text)
        return out + [self._event("response.reasoning_text.delta", **self._where(entry), delta=text)]

    def _open_text(self, item_id: str | None = None) -> list[bytes]:
        out = self._close("completed", *self._open)  # what came before (the thinking, calls) is finished
        return out + self._add("message", message_item(item_id or new_id("msg"), "in_progress", []), text_part("", []))

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        out = [] if "message" in self._open else self._open_text()
        entry = self._open["message"]
        entry.pieces.append(text)
        entry.logprobs.extend(logprobs)
        return out + [self._event("response.output_text.delta", **self._where(entry), delta=text, logprobs=logprobs)]

    def _open_call(self, index: int, call_id: str, name: str, namespace: str | None = None,
                  item_id: str | None = None) -> list[bytes]:
        out = self._close("completed", *self._open)  # what came before a call
        return out + self._add(index, function_call_item(item_id or new_id("fc"), call_id, name, "", "in_progress",
                                                         namespace))

    def _open_search(self, index: int, call_id: str) -> list[bytes]:
        """The model called the file_search function: a file_search_call item, whose arguments (the query)
        are gathered, not streamed."""
        out = self._close("completed", *self._open)
        item = self._searches.begin(call_id)
        out += self._add(index, item)
        return out + [self._event("response.file_search_call.in_progress", item_id=item["id"],
                                  output_index=self._open[index].output_index)]

    def _open_mcp(self, index: int, call_id: str, name: str) -> list[bytes]:
        """The model called an MCP tool: an mcp_call item whose arguments stream, or an approval request
        shown once its arguments are whole."""
        out = self._close("completed", *self._open)
        item = self._mcp.begin(call_id, name)
        out += self._add(index, item, shown=False)  # a call's added event is mcp/items.py's, with in_progress
        if item["type"] == "mcp_approval_request":
            return out
        return out + mcp_items.call_started_events(self._event, self._open[index].output_index, item)

    def _hosted_step(self, marker: int) -> list[bytes]:
        """Between two rounds: each pending search's `searching`, or (once the calls ran) each search's
        `completed`, each MCP call's `completed` or `failed`, and their items done; then the next round
        starts on a fresh fold."""
        entries = [e for e in self._items if e.item["type"] in ("file_search_call", "mcp_call") and not e.done]
        if marker == RUNNING:
            return [self._event("response.file_search_call.searching", item_id=e.item["id"],
                                output_index=e.output_index) for e in entries if e.item["type"] == "file_search_call"]
        out = []
        for entry in entries:
            entry.done = True
            entry.item = dict(entry.item)
            if entry.item["type"] == "mcp_call":
                out += mcp_items.call_ended_events(self._event, entry.output_index, entry.item)
                continue
            # `completed` whatever the outcome (OpenAI's events have no failed one): the item's status says.
            out += [self._event("response.file_search_call.completed", item_id=entry.item["id"],
                                output_index=entry.output_index),
                    self._event("response.output_item.done", output_index=entry.output_index, item=entry.item)]
        self._earlier_usage.append(self._fold.usage())
        self._fold = StreamFold()
        self._round_start = len(self._items)
        return out

    def round_items(self) -> list[dict[str, Any]]:
        """The items of the current round (tool_rounds.py replays them to the model)."""
        return [e.item for e in self._items[self._round_start:]]

    def _usage(self) -> dict[str, Any]:
        rounds = [*self._earlier_usage, self._fold.usage()]
        return usage_object(Usage(sum(u.prompt_tokens for u in rounds), sum(u.completion_tokens for u in rounds),
                                  sum(u.cached_tokens for u in rounds), sum(u.reasoning_tokens for u in rounds)))

    def _call_delta(self, index: int, arguments: str) -> list[bytes]:
        entry = self._open[index]
        entry.pieces.append(arguments)
        if entry.item["type"] == "file_search_call":
            self._searches.call_of(entry.item["id"]).arguments.append(arguments)
            return []
        if entry.item["type"] == "mcp_approval_request":
            return []  # shown whole at its end
        if entry.item["type"] == "mcp_call":
            self._mcp.call_of(entry.item["id"]).arguments.append(arguments)
            return [mcp_items.arguments_delta_event(self._event, entry.output_index, entry.item, arguments)]
        return [self._event("response.function_call_arguments.delta", item_id=entry.item["id"],
                            output_index=entry.output_index, delta=arguments)]

    def _close_items(self, status: str) -> list[bytes]:
        """Ends the open items; an answer with no item at all gets an empty message (as a whole one does)."""
        out = []
        if not self._items:  # with the logprobs of tokens that wrote no text, if any
            out = self._text_delta("", self._unwritten) if self._unwritten else self._open_text()
        if list(self._open) == ["reasoning"]:
            out += self._close(status, "reasoning") + self._open_text()  # no answer after it: an empty message
        return out + self._close(status, *self._open)

    def _output(self) -> list[dict[str, Any]]:
        """The items so far; those never finished are marked incomplete (an approval request never shown: left
        out, as is its status, which its type has not)."""
        out = []
        for e in self._items:
            if e.done:
                out.append(e.item)
            elif e.item["type"] != "mcp_approval_request":
                out.append({**e.item, "status": "incomplete"})
        return out

    def _end(self, status: str, usage: dict[str, Any] | None, error: APIError | None = None) -> list[bytes]:
        """The terminal event(s): response.completed / .incomplete, or error then response.failed."""
        if error is not None:
            error = self._named(error)
        response = self.final = self._skeleton.build(status, self._output(), usage, error)
        self._on_end(response)
        if error is None:
            return [self._event(f"response.{status}", response=response)]
        flat = {"code": error.code or error.type, "message": error.message, "param": error.param}
        return [self._event("error", **flat), self._event("response.failed", response=response)]

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]:
        out = self._start()
        if prompt_index in (RUNNING, RAN):
            return out + self._hosted_step(prompt_index)
        for e in self._fold.on_response(prompt_index, response):
            out += self._write(e)
        return out

    def _write(self, e: Event) -> list[bytes]:
        if isinstance(e, ReasoningDelta):
            self._unwritten = []  # its start marker's: the thinking's
            return self._reasoning_delta(e.text)
        if isinstance(e, TextDelta):
            logprobs = token_logprobs(e.logprobs) if self._logprobs else []
            if e.text or (logprobs and "message" in self._open):
                logprobs, self._unwritten = self._unwritten + logprobs, []
                return self._text_delta(e.text, logprobs)
            if "reasoning" not in self._open:  # while it thinks they are the thinking's: no item holds those
                self._unwritten += logprobs
        if isinstance(e, ToolCallStart):
            self._unwritten = []  # the call's own tokens: a function call item has no logprobs
            if self._searches is not None and self._searches.answers(e.name):
                return self._open_search(e.index, e.id)
            if self._mcp is not None and self._mcp.answers(e.name):
                return self._open_mcp(e.index, e.id, e.name)
            return self._open_call(e.index, e.id, *self._skeleton.call_name(e.name))
        if isinstance(e, ToolCallArguments) and e.arguments:
            return self._call_delta(e.index, e.arguments)
        if isinstance(e, ChoiceEnd):
            self._status = "incomplete" if e.reason is Finish.LENGTH else "completed"
            return self._close_items(self._status)
        return []

    def finish(self) -> list[bytes]:
        out = self._start() + self._close_items(self._status)
        return out + self._end(self._status, self._usage())

    def fail(self, error: APIError) -> list[bytes]:
        status = "cancelled" if error.code == CANCELLED_CODE else "failed"
        return self._start() + self._end(status, self._usage(), error)

    @classmethod
    def replay(cls, response: dict[str, Any]) -> list[bytes]:
        """A stored response as the events that streamed it: each text in one delta, each call's
        arguments in one delta, then its terminal event."""
        writer = cls(ResponseSkeleton.of(response), logprobs=False)
        out = writer._start()
        for k, item in enumerate(response["output"]):
            if item["type"] == "reasoning":
                out += writer._reasoning_delta("".join(c["text"] for c in item.get("content") or []), item["id"])
                out += writer._close(item["status"], "reasoning")
            elif item["type"] == "message":
                out += writer._open_text(item["id"])
                part = (item.get("content") or [{}])[0]
                if part.get("text"):
                    out += writer._text_delta(part["text"], part.get("logprobs") or [])
                out += writer._close_items(item["status"])
            elif item["type"] == "file_search_call":
                added = {**item, "status": "in_progress", "results": None}
                where = {"item_id": item["id"], "output_index": k}
                out += [writer._event("response.output_item.added", output_index=k, item=added)]
                out += [writer._event(f"response.file_search_call.{step}", **where)
                        for step in ("in_progress", "searching", "completed")]
                out += [writer._event("response.output_item.done", output_index=k, item=item)]
                writer._items.append(_Item(k, item, done=True))
            elif item["type"] in mcp_items.MCP_ITEM_TYPES:
                out += writer._whole_mcp_item(item)
            elif item["type"] == "function_call":
                out += writer._open_call(k, item["call_id"], item["name"], item.get("namespace"), item["id"])
                if item["arguments"]:
                    out += writer._call_delta(k, item["arguments"])
                out += writer._close_items(item["status"])
        status = response["status"]
        if status in ("completed", "incomplete"):
            return out + [writer._event(f"response.{status}", response=response)]
        error = response.get("error") or {"code": "server_error", "message": "The response failed."}
        return out + [writer._event("error", code=error.get("code"), message=error.get("message"), param=None),
                      writer._event("response.failed", response=response)]
