"""Translate a validated Messages API body (protocol.py's models) into the engine's chat request.

Anthropic's turns become the chat the engine renders: `system` the first message, a user turn's
`tool_result` blocks one `tool` message each (before the turn's text, as Anthropic orders them; with
`is_error`, its content after "Error: "), an assistant turn's `tool_use` blocks its tool calls.
`tools` / `tool_choice` and `output_config.format` become the same tool choice and constraint the
chat route builds, so forced calls and formats are enforced by the engine's constrained decoding.

A `system` message inside `messages` (Claude Code sends its environment, agent and skill lists that
way) is folded into the user turn it touches: appended to the user text just before it, else put
before the next user text, else a user turn of its own. Most chat templates refuse a system turn
after the first (Gemma's, Llama's), and folding it into the top system prompt would change the
prompt's prefix (a prefix-cache miss) each time an agent adds one; Claude Code's own fallback folds
them into the user turn too.

Refused with a 400 naming them (the engine cannot serve them, and dropping them would answer
another question): image, document and other non-text blocks, server tools, MCP servers, and a
final assistant turn (a prefill: the engine starts a new turn). `thinking` (docs/reasoning.md): on a
reasoning model, `enabled` asks for thinking (reasoning effort high) within `budget_tokens`, which
the engine enforces; `disabled` asks for none (effort none) where the model's template can switch it
off; `adaptive` leaves it to the template's default. Earlier `thinking` and `redacted_thinking`
blocks given back are dropped (DeepSeek-R1's and Qwen3's templates drop earlier turns' thinking too);
one without its `signature` is refused, as Anthropic refuses it. Accepted and ignored, as hints that
do not change the answer: `metadata.user_id`, `output_config.effort`, `context_management` (nothing
is kept here between requests), `cache_control` marks (the engine's prefix cache serves every
request), `service_tier`, `container`, the `?beta=true` query, the `anthropic-beta` header, and any
other unknown field. Tools with `defer_loading: true` are left out of the prompt, as Anthropic keeps
them out of the model's context until a tool search finds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from conduit.v1 import engine_pb2 as pb

from ..errors import APIError, invalid
from ..limits import DEFAULT_LIMITS, RequestLimits
from ..protocol.chat import chat_prompt_chars, check_prompt_chars
from ..protocol.base import parse
from .protocol import (CountTokensRequest, MessageParam, MessagesRequest, RedactedThinkingBlockParam,
                       TextBlockParam, ThinkingBlockParam, ThinkingConfigParam, ToolChoiceParam, ToolParam,
                       ToolResultBlockParam, ToolUseBlockParam)

_TOOL_CHOICES = {"auto": pb.ToolChoice.MODE_AUTO, "any": pb.ToolChoice.MODE_REQUIRED,
                 "tool": pb.ToolChoice.MODE_FUNCTION, "none": pb.ToolChoice.MODE_NONE}
TOOL_ERROR_PREFIX = "Error: "


@dataclass
class MessagesPlan:
    """One Messages request: its engine request and what the answer needs from the body."""

    model: str
    request: pb.GenerateRequest
    stream: bool
    stop_sequences: list[str]


# ------------------------------------------------------------------ turns


def _unsupported_block(kind: str, param: str) -> APIError:
    if kind in ("thinking", "redacted_thinking"):
        return invalid(f"'{param}' is a {kind} block: thinking blocks belong in assistant messages.", f"{param}.type")
    return invalid(
        f"Content blocks of type {json.dumps(kind)} are not supported by this server: it serves text, "
        "tool_use and tool_result blocks.",
        f"{param}.type",
    )


def _texts(content: str | list[TextBlockParam], param: str) -> str:
    """A string, or text blocks joined by newlines (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    for j, block in enumerate(content):
        if not isinstance(block, TextBlockParam):
            raise _unsupported_block(block.type, f"{param}[{j}]")
    return "\n".join(block.text for block in content)


def _tool_result(block: ToolResultBlockParam, param: str) -> pb.ChatMessage:
    text = "" if block.content is None else _texts(block.content, f"{param}.content")
    if block.is_error:
        text = TOOL_ERROR_PREFIX + text
    return pb.ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=text)


def _turn(msg: MessageParam, i: int) -> list[pb.ChatMessage]:
    """One Anthropic message -> the chat messages it becomes."""
    param, role = f"messages[{i}]", msg.role
    if role == "system":
        return [pb.ChatMessage(role=role, content=_texts(msg.content, f"{param}.content"))]
    if isinstance(msg.content, str):
        return [pb.ChatMessage(role=role, content=msg.content)]
    texts: list[str] = []
    results: list[pb.ChatMessage] = []
    calls: list[pb.ToolCall] = []
    for j, block in enumerate(msg.content):
        where = f"{param}.content[{j}]"
        if isinstance(block, TextBlockParam):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlockParam) and role == "user":
            results.append(_tool_result(block, where))
        elif isinstance(block, ToolUseBlockParam) and role == "assistant":
            calls.append(pb.ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input)))
        elif isinstance(block, (ThinkingBlockParam, RedactedThinkingBlockParam)) and role == "assistant":
            continue  # an earlier turn's thinking: dropped (see the module's docstring)
        elif block.type in ("tool_result", "tool_use"):
            raise invalid(f"'{where}': {block.type} blocks belong in "
                          f"{'user' if block.type == 'tool_result' else 'assistant'} messages.", f"{where}.type")
        else:
            raise _unsupported_block(block.type, where)
    if role == "assistant":
        return [pb.ChatMessage(role=role, content="\n".join(texts), tool_calls=calls)]
    return results + ([pb.ChatMessage(role=role, content="\n".join(texts))] if texts or not results else [])


def _fold_system_turns(messages: list[pb.ChatMessage]) -> list[pb.ChatMessage]:
    """System messages from `messages` merged into the user turn they touch (see the module's docstring)."""
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


def _chat_messages(body: CountTokensRequest) -> list[pb.ChatMessage]:
    messages = _fold_system_turns([m for i, item in enumerate(body.messages) for m in _turn(item, i)])
    if body.system is not None:
        messages.insert(0, pb.ChatMessage(role="system", content=_texts(body.system, "system")))
    return messages


# ------------------------------------------------------------------ tools, format, thinking


def _tools(body: CountTokensRequest) -> list[pb.Tool]:
    tools = []
    for k, tool in enumerate(body.tools or []):
        if not isinstance(tool, ToolParam):
            raise invalid(
                f"'tools[{k}]' is a server tool ({json.dumps(tool.type)}), which this server does not run: "
                "define client tools with name, description and input_schema.",
                f"tools[{k}].type",
            )
        if tool.defer_loading:
            continue  # not in the model's context until a tool search finds it
        tools.append(pb.Tool(name=tool.name, description=tool.description,
                             parameters_json=tool.input_schema))
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
        if choice.name is None:
            raise invalid("'tool_choice.name' is required.", "tool_choice.name")
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


def chat_input(body: CountTokensRequest, limits: RequestLimits = DEFAULT_LIMITS) -> pb.ChatInput:
    """The chat the engine renders for a validated Messages (or count_tokens) body."""
    messages = _chat_messages(body)
    tools = _tools(body)
    check_prompt_chars(chat_prompt_chars(messages, tools), "messages", limits)
    # thinking: "enabled" asks for high effort, "disabled" for none, "adaptive" the template's default.
    thinking = body.thinking and body.thinking.type
    effort = {"enabled": "high", "disabled": "none"}.get(thinking, "")
    chat = pb.ChatInput(messages=messages, tools=tools, reasoning_effort=effort)
    _tool_choice(body.tool_choice, tools, chat)
    return chat


# ------------------------------------------------------------------ requests


def _sampling(body: MessagesRequest) -> pb.SamplingParams:
    return pb.SamplingParams(**{name: value for name in ("temperature", "top_p", "top_k")
                                if (value := getattr(body, name)) is not None})


def parse_messages(body: Any, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> MessagesPlan:
    """Validate a /v1/messages body and build its GenerateRequest."""
    typed = parse(MessagesRequest, body, limits=limits)
    stops = list(typed.stop_sequences or [])
    thinking = typed.thinking or ThinkingConfigParam(type="adaptive")
    sampling = {name: getattr(typed, name) for name in ("temperature", "top_p", "top_k")}
    request = pb.GenerateRequest(
        request_id=request_id,
        model=typed.model,
        chat=chat_input(typed, limits),
        sampling=pb.SamplingParams(**sampling),
        stopping=pb.StoppingParams(max_tokens=typed.max_tokens, stop=stops),
        constraint=_constraint(typed),
        max_reasoning_tokens=thinking.budget_tokens if thinking.type == "enabled" else None,
    )
    return MessagesPlan(typed.model, request, bool(typed.stream), stops)


def parse_count_tokens(body: Any, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[str, pb.TokenizeRequest]:
    """Validate a /v1/messages/count_tokens body: the model and the TokenizeRequest that renders
    the prompt exactly as the same /v1/messages request would."""
    typed = parse(CountTokensRequest, body, limits=limits)
    return typed.model, pb.TokenizeRequest(model=typed.model, chat=chat_input(typed, limits),
                                           constraint=_constraint(typed))
