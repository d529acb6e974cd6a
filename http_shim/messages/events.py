"""The Messages event stream, as the relay's EventWriter (the events: docs/messages.md).

`event: <type>` equals the data's `type`; a reasoning model's thinking block ends with one
`signature_delta`; a stream the engine (or a drain) cut ends with an `error` event and nothing after it.
"""

from __future__ import annotations

from typing import Any

from conduit_common.results import Usage
from conduit.v1 import engine_pb2 as pb

from ..errors import APIError
from ..sse import named_event as event
from ..stream_fold import (ChoiceEnd, Event, Finish, PromptRead, ReasoningDelta, StreamFold, TextDelta,
                           ToolCallArguments, ToolCallStart)
from .errors import error_object
from .response import envelope, stop_reason, thinking_signature, tool_input, tool_use_block, usage_object


class MessagesEvents:
    """The relay's EventWriter for /v1/messages, and so the whole answer too (the relay's collect):
    `final` is the message its events wrote, once they are finished."""

    heartbeat = event({"type": "ping"})

    def __init__(self, message_id: str, model: str, stop_sequences: list[str]) -> None:
        self._id, self._model, self._stops = message_id, model, stop_sequences
        self._fold = StreamFold()
        self._input = Usage(0, 0)  # the prompt's, for message_start
        self._started = False
        self._content: list[dict[str, Any]] = []  # the blocks so far; the last one is open while `_open`
        self._open: str | None = None  # the open block's type: "thinking", "text" or "tool_use"
        self._pieces: list[str] = []  # the open block's thinking, text or input JSON, as streamed
        self._end: ChoiceEnd | None = None
        self.final: dict[str, Any] = {}

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [event({"type": "message_start",
                       "message": envelope(self._id, self._model, usage_object(self._input))})]

    def _close(self) -> list[bytes]:
        """The open block's end; the block in the content is then whole."""
        if self._open is None:
            return []
        block, streamed = self._content[-1], "".join(self._pieces)
        out = []
        if self._open == "thinking":  # its signature ends it
            block.update(thinking=streamed, signature=thinking_signature(streamed))
            out.append(self._delta({"type": "signature_delta", "signature": block["signature"]}))
        elif self._open == "text":
            block["text"] = streamed
        else:
            block["input"] = tool_input(streamed)
        self._open = None
        return out + [event({"type": "content_block_stop", "index": len(self._content) - 1})]

    def _open_block(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._content.append(block)
        self._open, self._pieces = block["type"], []
        return out + [event({"type": "content_block_start", "index": len(self._content) - 1, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": len(self._content) - 1, "delta": delta})

    def _piece(self, block: dict[str, Any], delta: dict[str, Any], piece: str) -> list[bytes]:
        """A piece of thinking or text: `block` opens first unless a block of its type is open."""
        out = [] if self._open == block["type"] else self._open_block(block)
        self._pieces.append(piece)
        return out + [self._delta(delta)]

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]:
        out: list[bytes] = []
        for e in self._fold.on_response(prompt_index, response):
            out += self._write(e)
        return self._start() + out  # message_start first, with the prompt's usage when it came

    def _write(self, e: Event) -> list[bytes]:
        if isinstance(e, PromptRead):
            self._input = Usage(e.prompt.prompt_tokens, 0, e.prompt.cached_tokens)
        elif isinstance(e, ReasoningDelta):
            return self._piece({"type": "thinking", "thinking": "", "signature": ""},
                               {"type": "thinking_delta", "thinking": e.text}, e.text)
        elif isinstance(e, TextDelta) and e.text:
            return self._piece({"type": "text", "text": ""}, {"type": "text_delta", "text": e.text}, e.text)
        elif isinstance(e, ToolCallStart):
            return self._open_block(tool_use_block(e.id, e.name, None))
        elif isinstance(e, ToolCallArguments) and e.arguments:  # to the call's block, opened by its start
            self._pieces.append(e.arguments)
            return [self._delta({"type": "input_json_delta", "partial_json": e.arguments})]
        elif isinstance(e, ChoiceEnd):
            self._end = e
        return []

    def finish(self) -> list[bytes]:
        choice = self._end or ChoiceEnd(0, 0, Finish.STOP, "")  # no final: the engine gave no reason
        reason, sequence = stop_reason(choice.reason, choice.matched_stop, self._stops)
        usage = usage_object(self._fold.finish().usage)
        out = self._start() + self._close()
        self.final = {**envelope(self._id, self._model, usage), "content": self._content, "stop_reason": reason,
                      "stop_sequence": sequence}
        return out + [
            event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage}),
            event({"type": "message_stop"}),
        ]

    def fail(self, error: APIError) -> list[bytes]:
        return [event({"type": "error", "error": error_object(error)})]
