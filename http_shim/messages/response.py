"""The message object's parts, which the event stream (events.py) writes; a whole answer is its final message."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from conduit_common.results import Usage

from ..stream_fold import Finish


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


def tool_use_block(call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
    """A tool_use block; `arguments` None: its start in a stream (input follows as deltas). Its id is the
    call's (`call_` + hex; the fold gives one to a call the engine sent none for) as `toolu_` + hex."""
    return {"type": "tool_use", "id": "toolu_" + call_id.removeprefix("call_"), "name": name,
            "input": {} if arguments is None else tool_input(arguments)}
