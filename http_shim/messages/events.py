"""The Messages answer: the message's parts, and the event stream that writes them as the relay's
EventWriter (the events: docs/messages.md); a whole answer is the stream's final message.

`event: <type>` equals the data's `type`; a reasoning model's thinking block ends with one
`signature_delta`; a stream the engine (or a drain) cut ends with an `error` event and nothing after it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from conduit_common.results import Usage
from conduit.v1 import engine_pb2 as pb

from ..errors import APIError
from ..sse import named_event as event
from ..stream_fold import (ChoiceEnd, Event, Finish, PromptRead, ReasoningDelta, StreamFold, TextDelta,
                           ToolCallArguments, ToolCallStart)
from .errors import error_object


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: str) -> dict[str, Any]:
    """The call's arguments as the object Anthropic's `input` is; {} for arguments cut short by
    max_tokens (not JSON) or not an object."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# Anthropic's words for why a message ended (a stop string the client sent is named, see stop_reason).
_STOP_REASONS = {Finish.STOP: "end_turn", Finish.LENGTH: "max_tokens", Finish.TOOL_CALLS: "tool_use"}


def stop_reason(reason: Finish, matched_stop: str, stop_sequences: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop string the client sent is named; EOS is end_turn."""
    word = _STOP_REASONS[reason]
    if word == "end_turn" and matched_stop and matched_stop in stop_sequences:
        return "stop_sequence", matched_stop
    return word, None


def usage_object(usage: Usage) -> dict[str, Any]:
    """Anthropic's `input_tokens` excludes cache reads; the engine caches by itself, so nothing is written."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def envelope(message_id: str, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The message before its content and stop reason (message_start carries this)."""
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: a checksum, not Anthropic's attestation (docs/reasoning.md)."""
    return "conduit-sha256:" + hashlib.sha256(thinking.encode()).hexdigest()


def tool_use_block(call_id: str, name: str) -> dict[str, Any]:
    """A tool_use block as it starts (its input follows as deltas). Its id is the call's (`call_` + hex;
    the fold gives one to a call the engine sent none for) as `toolu_` + hex."""
    return {"type": "tool_use", "id": "toolu_" + call_id.removeprefix("call_"), "name": name, "input": {}}


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
            return self._open_block(tool_use_block(e.id, e.name))
        elif isinstance(e, ToolCallArguments) and e.arguments:  # to the call's block, opened by its start
            self._pieces.append(e.arguments)
            return [self._delta({"type": "input_json_delta", "partial_json": e.arguments})]
        elif isinstance(e, ChoiceEnd):
            self._end = e
        return []

    def finish(self) -> list[bytes]:
        choice = self._end or ChoiceEnd(0, 0, Finish.STOP, "")  # no final: the engine gave no reason
        reason, sequence = stop_reason(choice.reason, choice.matched_stop, self._stops)
        usage = usage_object(self._fold.usage())
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
