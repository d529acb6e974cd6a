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
from .response import envelope, stop_reason, thinking_signature, tool_use_block, usage_object


class MessagesEvents:
    heartbeat = event({"type": "ping"})

    def __init__(self, message_id: str, model: str, stop_sequences: list[str]) -> None:
        self._id, self._model, self._stops = message_id, model, stop_sequences
        self._fold = StreamFold()
        self._input = Usage(0, 0)  # the prompt's, for message_start
        self._started = False
        self._block = -1  # index of the latest block
        self._open: str | None = None  # the open block's type: "thinking", "text" or "tool_use"
        self._end: ChoiceEnd | None = None
        self._thought: list[str] = []  # the thinking text, for its signature

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [event({"type": "message_start",
                       "message": envelope(self._id, self._model, usage_object(self._input))})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":  # its signature ends it
            signature = thinking_signature("".join(self._thought))
            out.append(self._delta({"type": "signature_delta", "signature": signature}))
        self._open = None
        return out + [event({"type": "content_block_stop", "index": self._block})]

    def _open_block(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._block += 1
        self._open = block["type"]
        return out + [event({"type": "content_block_start", "index": self._block, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self._block, "delta": delta})

    def _thinking(self, text: str) -> list[bytes]:
        block = {"type": "thinking", "thinking": "", "signature": ""}
        out = [] if self._open == "thinking" else self._open_block(block)
        self._thought.append(text)
        return out + [self._delta({"type": "thinking_delta", "thinking": text})]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self._open == "text" else self._open_block({"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": text})]

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]:
        out: list[bytes] = []
        for e in self._fold.on_response(prompt_index, response):
            out += self._write(e)
        return self._start() + out  # message_start first, with the prompt's usage when it came

    def _write(self, e: Event) -> list[bytes]:
        if isinstance(e, PromptRead):
            self._input = Usage(e.prompt.prompt_tokens, 0, e.prompt.cached_tokens)
        elif isinstance(e, ReasoningDelta):
            return self._thinking(e.text)
        elif isinstance(e, TextDelta) and e.text:
            return self._text(e.text)
        elif isinstance(e, ToolCallStart):
            return self._open_block(tool_use_block(e.id, e.name, None))
        elif isinstance(e, ToolCallArguments) and e.arguments:
            return [self._delta({"type": "input_json_delta", "partial_json": e.arguments})]
        elif isinstance(e, ChoiceEnd):
            self._end = e
        return []

    def finish(self) -> list[bytes]:
        choice = self._end or ChoiceEnd(0, 0, Finish.STOP, "")  # no final: the engine gave no reason
        reason, sequence = stop_reason(choice.reason, choice.matched_stop, self._stops)
        return self._start() + self._close() + [
            event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage_object(self._fold.finish().usage)}),
            event({"type": "message_stop"}),
        ]

    def fail(self, error: APIError) -> list[bytes]:
        return [event({"type": "error", "error": error_object(error)})]
