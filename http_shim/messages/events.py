"""The Messages event stream, as the relay's EventWriter.

`message_start` (the message, empty, with its input usage), then per content block
`content_block_start` / `content_block_delta` (`thinking_delta` then one `signature_delta` for a
reasoning model's thinking, `text_delta`, or `input_json_delta` whose `partial_json` pieces
concatenate to the tool's input) / `content_block_stop`, then
`message_delta` (stop reason and sequence, output usage) and `message_stop`. `ping` is the
heartbeat; a stream the engine (or a drain) cut ends with an `error` event and nothing after it.
Every event is `event: <type>` plus `data: <json>` whose `type` is the same name.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import finish_reason_name, new_tool_call_id

from ..errors import APIError
from .errors import error_object
from .response import SIGNATURE_PREFIX, envelope, stop_reason, tool_use_block, usage_object


def event(data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


PING = event({"type": "ping"})


class MessagesEvents:
    heartbeat = PING

    def __init__(self, message_id: str, model: str, stop_sequences: list[str]) -> None:
        self._id, self._model, self._stops = message_id, model, stop_sequences
        self._prompt: pb.PromptInfo | None = None
        self._started = False
        self._block = -1  # index of the latest block
        self._open: tuple[str, int] | None = None  # ("text", 0) or ("tool", call index)
        self._output_tokens = 0
        self._final: pb.Final | None = None
        self._streamed_calls: set[int] = set()
        self._thought = hashlib.sha256()  # of the thinking block's text, for its signature

    # ------------------------------------------------------------------ blocks

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [event({"type": "message_start",
                       "message": envelope(self._id, self._model, usage_object(self._prompt, 0))})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        if self._open == ("thinking", 0):  # its signature (response.thinking_signature) ends it
            signature = SIGNATURE_PREFIX + self._thought.hexdigest()
            self._open = None
            return [self._delta({"type": "signature_delta", "signature": signature}),
                    event({"type": "content_block_stop", "index": self._block})]
        self._open = None
        return [event({"type": "content_block_stop", "index": self._block})]

    def _open_block(self, kind: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._block += 1
        self._open = kind
        return out + [event({"type": "content_block_start", "index": self._block, "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self._block, "delta": delta})

    def _thinking(self, text: str) -> list[bytes]:
        out = [] if self._open == ("thinking", 0) else self._open_block(
            ("thinking", 0), {"type": "thinking", "thinking": "", "signature": ""})
        self._thought.update(text.encode())
        return out + [self._delta({"type": "thinking_delta", "thinking": text})]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self._open == ("text", 0) else self._open_block(("text", 0), {"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": text})]

    def _tool(self, call: pb.ToolCallDelta) -> list[bytes]:
        out = []
        if self._open != ("tool", call.index):
            self._streamed_calls.add(call.index)
            block = tool_use_block(call.id or new_tool_call_id(), call.name, None)
            out = self._open_block(("tool", call.index), block)
        if call.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return out

    # ------------------------------------------------------------------ EventWriter

    def on_response(self, prompt_index: int, response: pb.GenerateResponse) -> list[bytes]:
        kind = response.WhichOneof("kind")
        if kind == "prompt":
            self._prompt = response.prompt
            return self._start()
        out = self._start()
        if kind == "chunk":
            chunk = response.chunk
            self._output_tokens = chunk.completion_tokens
            if chunk.reasoning_text:
                out += self._thinking(chunk.reasoning_text)
            if chunk.text:
                out += self._text(chunk.text)
            for call in chunk.tool_calls:
                out += self._tool(call)
        elif kind == "final":
            final = self._final = response.final
            self._output_tokens = final.completion_tokens
            for k, call in enumerate(final.tool_calls):
                if k not in self._streamed_calls:  # not streamed piecewise: one whole delta
                    out += self._tool(pb.ToolCallDelta(index=k, id=call.id, name=call.name, arguments=call.arguments))
        return out

    def finish(self) -> list[bytes]:
        final = self._final
        reason, sequence = stop_reason(finish_reason_name(final.finish_reason) if final else None,
                                       final.matched_stop if final else "", self._stops)
        usage = usage_object(self._prompt, self._output_tokens)
        return self._start() + self._close() + [
            event({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage}),
            event({"type": "message_stop"}),
        ]

    def fail(self, error: APIError) -> list[bytes]:
        return [event({"type": "error", "error": error_object(error)})]
