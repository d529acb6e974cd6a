"""A validated Messages body (protocol.py) -> the engine's chat request (what is served: docs/messages.md).

`system` is the first message; a user turn's `tool_result` blocks become one `tool` message each, before
its text (with `is_error`, the content after "Error: "); an assistant turn's `tool_use` blocks its calls.
`tools`, `tool_choice` and `output_config.format` become the chat route's tool choice and constraint.

A `system` message inside `messages` (Claude Code sends its environment and skill lists that way) joins
the user turn it touches, as Claude Code's own fallback does: most chat templates refuse a later system
turn (Gemma's, Llama's), and folding it into the top system prompt would change the prompt's prefix (a
prefix-cache miss) each time an agent adds one.

`thinking` maps onto the reasoning effort and budget, and earlier thinking blocks are dropped: docs/reasoning.md.
Hints that do not change the answer are accepted and ignored: `metadata`, `output_config.effort`,
`cache_control` (the prefix cache serves every request), `context_management`, `?beta=true`, the
`anthropic-beta` header, unknown fields. Tools with `defer_loading: true` stay out of the prompt, as
Anthropic keeps them out until a tool search finds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from conduit.v1 import engine_pb2 as pb

from ..errors import invalid
from ..limits import DEFAULT_LIMITS, RequestLimits
from ..protocol.base import parse
from ..protocol.chat import chat_prompt_chars, check_prompt_chars
from ..protocol.sampling import sampling_params, stopping_params
from .protocol import (CountTokensRequest, MessageParam, MessagesRequest, TextBlockParam, ThinkingConfigParam,
                       ToolChoiceParam, ToolResultBlockParam, ToolUseBlockParam)

_TOOL_CHOICES = {"auto": pb.ToolChoice.MODE_AUTO, "any": pb.ToolChoice.MODE_REQUIRED,
                 "tool": pb.ToolChoice.MODE_FUNCTION, "none": pb.ToolChoice.MODE_NONE}


@dataclass
class MessagesPlan:
    """One Messages request: its engine request and what the answer needs from the body."""

    model: str
    request: pb.GenerateRequest
    stream: bool
    stop_sequences: list[str]


def _texts(content: str | list[TextBlockParam]) -> str:
    return content if isinstance(content, str) else "\n".join(b.text for b in content if isinstance(b, TextBlockParam))


def _tool_result(block: ToolResultBlockParam) -> pb.ChatMessage:
    text = "" if block.content is None else _texts(block.content)
    return pb.ChatMessage(role="tool", tool_call_id=block.tool_use_id,
                          content="Error: " + text if block.is_error else text)


def _turn(msg: MessageParam) -> list[pb.ChatMessage]:
    """One Anthropic message (its blocks where its role allows them) -> the chat messages it becomes."""
    if isinstance(msg.content, str) or msg.role == "system":
        return [pb.ChatMessage(role=msg.role, content=_texts(msg.content))]
    text = _texts(msg.content)
    if msg.role == "assistant":  # an earlier turn's thinking is dropped (see the module's docstring)
        calls = [pb.ToolCall(id=b.id, name=b.name, arguments=json.dumps(b.input))
                 for b in msg.content if isinstance(b, ToolUseBlockParam)]
        return [pb.ChatMessage(role="assistant", content=text, tool_calls=calls)]
    results = [_tool_result(b) for b in msg.content if isinstance(b, ToolResultBlockParam)]
    has_text = any(isinstance(b, TextBlockParam) for b in msg.content)
    return results + ([pb.ChatMessage(role="user", content=text)] if has_text or not results else [])


def _fold_system_turns(messages: list[pb.ChatMessage]) -> list[pb.ChatMessage]:
    """System messages appended to the user text just before them, else put before the next user text,
    else a user turn of their own."""
    out: list[pb.ChatMessage] = []
    pending: list[str] = []  # system texts waiting for the next user text
    for msg in messages:
        if msg.role == "system":
            if not pending and out and out[-1].role == "user":
                out[-1].content = f"{out[-1].content}\n\n{msg.content}" if out[-1].content else msg.content
            else:
                pending.append(msg.content)
            continue
        if pending and msg.role == "user":
            msg.content = "\n\n".join(pending + ([msg.content] if msg.content else []))
            pending = []
        elif pending and msg.role != "tool":  # an assistant turn next: the texts stand as a user turn
            out.append(pb.ChatMessage(role="user", content="\n\n".join(pending)))
            pending = []
        out.append(msg)
    if pending:
        out.append(pb.ChatMessage(role="user", content="\n\n".join(pending)))
    return out


def _tools(body: CountTokensRequest) -> list[pb.Tool]:
    tools = [pb.Tool(name=tool.name, description=tool.description, parameters_json=tool.input_schema)
             for tool in body.tools or [] if not tool.defer_loading]
    if len({t.name for t in tools}) < len(tools):
        raise invalid("'tools' names a tool twice.", "tools")
    return tools


def _tool_choice(choice: ToolChoiceParam | None, tools: list[pb.Tool], chat: pb.ChatInput) -> None:
    if choice is None:
        return
    if choice.type in ("any", "tool") and not tools:
        raise invalid(f"'tool_choice' is '{choice.type}' but no 'tools' were given.", "tool_choice")
    chat.tool_choice.mode = _TOOL_CHOICES[choice.type]
    if choice.type == "tool":
        if choice.name not in {t.name for t in tools}:
            raise invalid(f"'tool_choice' names the tool '{choice.name}', which is not in 'tools'.",
                          "tool_choice.name")
        chat.tool_choice.function_name = choice.name
    if choice.disable_parallel_tool_use:
        chat.parallel_tool_calls = False


def _constraint(body: CountTokensRequest) -> pb.Constraint | None:
    """`output_config.format`, or the beta's top-level `output_format`."""
    formats = [f for f in (body.output_config and body.output_config.format, body.output_format) if f is not None]
    if len(formats) > 1:
        raise invalid("Use either 'output_config.format' or 'output_format', not both.", "output_format")
    return pb.Constraint(json_schema=formats[0].schema_) if formats else None


def chat_input(body: CountTokensRequest, limits: RequestLimits) -> pb.ChatInput:
    """The chat the engine renders for a validated Messages (or count_tokens) body."""
    messages = _fold_system_turns([m for item in body.messages for m in _turn(item)])
    if body.system is not None:
        messages.insert(0, pb.ChatMessage(role="system", content=_texts(body.system)))
    tools = _tools(body)
    check_prompt_chars(chat_prompt_chars(messages, tools), "messages", limits)
    thinking = body.thinking and body.thinking.type
    effort = {"enabled": "high", "disabled": "none"}.get(thinking, "")
    chat = pb.ChatInput(messages=messages, tools=tools, reasoning_effort=effort)
    _tool_choice(body.tool_choice, tools, chat)
    return chat


def parse_messages(body: Any, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> MessagesPlan:
    """Validate a /v1/messages body and build its GenerateRequest."""
    typed = parse(MessagesRequest, body, limits=limits)
    stops = list(typed.stop_sequences or [])
    thinking = typed.thinking or ThinkingConfigParam(type="adaptive")
    request = pb.GenerateRequest(
        request_id=request_id,
        model=typed.model,
        chat=chat_input(typed, limits),
        sampling=sampling_params(typed),  # temperature, top_p and top_k: Anthropic's
        stopping=stopping_params(typed, typed.max_tokens, stops),
        constraint=_constraint(typed),
        max_reasoning_tokens=thinking.budget_tokens if thinking.type == "enabled" else None,
    )
    return MessagesPlan(typed.model, request, bool(typed.stream), stops)


def parse_count_tokens(body: Any, limits: RequestLimits) -> pb.TokenizeRequest:
    """The TokenizeRequest that renders the prompt exactly as /v1/messages would."""
    typed = parse(CountTokensRequest, body, limits=limits)
    return pb.TokenizeRequest(model=typed.model, chat=chat_input(typed, limits), constraint=_constraint(typed))
