"""Validate a Messages API body and translate it into the engine's chat request.

Anthropic's turns become the chat the engine renders: `system` the first message, a user turn's
`tool_result` blocks one `tool` message each (before the turn's text, as Anthropic orders them),
an assistant turn's `tool_use` blocks its tool calls. `tools` / `tool_choice` and
`output_config.format` become the same tool choice and constraint the chat route builds, so forced
calls and formats are enforced by the engine's constrained decoding.

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
off; `adaptive` leaves it to the template's default. A model that does not reason answers without
thinking whatever is asked. Earlier `thinking` and `redacted_thinking` blocks given back in
`messages` are accepted and dropped (DeepSeek-R1's and Qwen3's templates drop earlier turns' thinking
too); a thinking block without its `signature` is refused, as Anthropic refuses it. Accepted and ignored, as hints that do not change
the answer: `metadata.user_id`, `output_config.effort`, `context_management` (its edits clear old
thinking and tool results server-side; nothing is kept here between requests), `cache_control` marks
(the engine's prefix cache serves every request), `service_tier`, `container`, the `?beta=true` query,
the `anthropic-beta` header, and any other unknown top-level field. Tools with `defer_loading: true`
are left out of the prompt, as Anthropic keeps them out of the model's context until a tool search
finds them. A `tool_result` with `is_error` reaches the model as "Error: " and its content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import SAMPLING_RANGES, Range

from ..errors import invalid
from ..fields import bool_field, dict_value, int_field, list_value, number_field, str_value
from ..limits import DEFAULT_LIMITS, RequestLimits
from ..openai.request import TOOL_NAME, chat_prompt_chars, check_prompt_chars, max_tokens_field, model_field, schema_text

TEMPERATURE_RANGE = Range(0.0, 1.0)  # Anthropic's, narrower than the engine's
_ROLES = ("user", "assistant", "system")
_THINKING = ("adaptive", "enabled", "disabled")
_TOOL_CHOICES = {
    "auto": pb.ToolChoice.MODE_AUTO,
    "any": pb.ToolChoice.MODE_REQUIRED,
    "tool": pb.ToolChoice.MODE_FUNCTION,
    "none": pb.ToolChoice.MODE_NONE,
}
TOOL_ERROR_PREFIX = "Error: "


@dataclass
class MessagesPlan:
    """One Messages request: its engine request and what the answer needs from the body."""

    model: str
    request: pb.GenerateRequest
    stream: bool
    stop_sequences: list[str]


@dataclass
class ChatParts:
    """What both /v1/messages and count_tokens render: the chat and the answer format."""

    model: str
    chat: pb.ChatInput
    constraint: pb.Constraint | None
    thinking_budget: int | None = None  # thinking.budget_tokens, for the engine to enforce


# ------------------------------------------------------------------ small readers


def _cache_control(value: Any, param: str) -> None:
    """Accepted (the prefix cache is automatic); checked, so a typo is not taken for a mark."""
    if value is None:
        return
    mark = dict_value(value, param)
    if mark.get("type") != "ephemeral":
        raise invalid(f"'{param}.type' must be 'ephemeral', got {json.dumps(mark.get('type'))}.", f"{param}.type")


def _unsupported_block(kind: Any, param: str) -> Exception:
    if kind in ("thinking", "redacted_thinking"):
        return invalid(f"'{param}' is a {kind} block: thinking blocks belong in assistant messages.", f"{param}.type")
    return invalid(
        f"Content blocks of type {json.dumps(kind)} are not supported by this server: it serves text, "
        "tool_use and tool_result blocks.",
        f"{param}.type",
    )


def _text_block(block: dict, param: str) -> str:
    _cache_control(block.get("cache_control"), f"{param}.cache_control")
    return str_value(block.get("text"), f"{param}.text")


def _blocks(value: Any, param: str) -> list[dict]:
    """A content array: every item an object with a type."""
    blocks = list_value(value, param)
    for j, block in enumerate(blocks):
        if not isinstance(dict_value(block, f"{param}[{j}]").get("type"), str):
            raise invalid(f"'{param}[{j}].type' must be a string.", f"{param}[{j}].type")
    return blocks


def _texts(value: Any, param: str) -> str:
    """A string, or text blocks joined by newlines (system prompts, tool results)."""
    if isinstance(value, str):
        return value
    texts = []
    for j, block in enumerate(_blocks(value, param)):
        if block["type"] != "text":
            raise _unsupported_block(block["type"], f"{param}[{j}]")
        texts.append(_text_block(block, f"{param}[{j}]"))
    return "\n".join(texts)


# ------------------------------------------------------------------ turns


def _tool_result(block: dict, param: str) -> pb.ChatMessage:
    _cache_control(block.get("cache_control"), f"{param}.cache_control")
    content = block.get("content")
    text = "" if content is None else _texts(content, f"{param}.content")
    if bool_field(block, "is_error", f"{param}.is_error"):
        text = TOOL_ERROR_PREFIX + text
    call_id = str_value(block.get("tool_use_id"), f"{param}.tool_use_id", allow_empty=False)
    return pb.ChatMessage(role="tool", tool_call_id=call_id, content=text)


def _tool_use(block: dict, param: str) -> pb.ToolCall:
    _cache_control(block.get("cache_control"), f"{param}.cache_control")
    return pb.ToolCall(
        id=str_value(block.get("id"), f"{param}.id", allow_empty=False),
        name=str_value(block.get("name"), f"{param}.name", allow_empty=False),
        arguments=json.dumps(dict_value(block.get("input"), f"{param}.input")),
    )


def _turn(value: Any, i: int) -> list[pb.ChatMessage]:
    """One Anthropic message -> the chat messages it becomes."""
    param = f"messages[{i}]"
    msg = dict_value(value, param)
    role = msg.get("role")
    if role not in _ROLES:  # worded as Anthropic's validation error, which clients match on
        raise invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system', got {json.dumps(role)}.",
                      f"{param}.role")
    content = msg.get("content")
    if role == "system":
        return [pb.ChatMessage(role=role, content=_texts(content, f"{param}.content"))]
    if isinstance(content, str):
        return [pb.ChatMessage(role=role, content=content)]
    texts: list[str] = []
    results: list[pb.ChatMessage] = []
    calls: list[pb.ToolCall] = []
    for j, block in enumerate(_blocks(content, f"{param}.content")):
        where, kind = f"{param}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, where))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, where))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            _given_back_thinking(block, where)
        elif kind in ("tool_result", "tool_use"):
            raise invalid(f"'{where}': {kind} blocks belong in {'user' if kind == 'tool_result' else 'assistant'} "
                          "messages.", f"{where}.type")
        else:
            raise _unsupported_block(kind, where)
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


def _chat_messages(body: dict, limits: RequestLimits) -> list[pb.ChatMessage]:
    items = list_value(body.get("messages"), "messages")
    if len(items) > limits.max_messages:
        raise invalid(
            f"'messages' may hold at most {limits.max_messages} messages on this server, got {len(items)}.",
            "messages",
        )
    if isinstance(items[-1], dict) and items[-1].get("role") == "assistant":
        raise invalid(
            "The last message is an assistant turn (a prefill), which this server cannot continue: end with "
            "a user message.",
            f"messages[{len(items) - 1}].role",
        )
    messages = _fold_system_turns([m for i, item in enumerate(items) for m in _turn(item, i)])
    system = body.get("system")
    if system is not None:
        messages.insert(0, pb.ChatMessage(role="system", content=_texts(system, "system")))
    return messages


# ------------------------------------------------------------------ tools, format


def _tools(body: dict) -> list[pb.Tool]:
    value = body.get("tools")
    if value is None:
        return []
    tools = []
    for k, item in enumerate(list_value(value, "tools", allow_empty=True)):
        param = f"tools[{k}]"
        tool = dict_value(item, param)
        if tool.get("type", "custom") not in ("custom", None):
            raise invalid(
                f"'{param}' is a server tool ({json.dumps(tool.get('type'))}), which this server does not run: "
                "define client tools with name, description and input_schema.",
                f"{param}.type",
            )
        name = str_value(tool.get("name"), f"{param}.name")
        if not TOOL_NAME.match(name):
            raise invalid(f"'{param}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$, got {json.dumps(name)}.",
                          f"{param}.name")
        _cache_control(tool.get("cache_control"), f"{param}.cache_control")
        if tool.get("input_schema") is None:
            raise invalid(f"'{param}.input_schema' is required.", f"{param}.input_schema")
        if bool_field(tool, "defer_loading", f"{param}.defer_loading"):
            continue  # not in the model's context until a tool search finds it
        tools.append(pb.Tool(
            name=name,
            description=str_value(tool.get("description") or "", f"{param}.description"),
            parameters_json=schema_text(tool["input_schema"], f"{param}.input_schema"),
        ))
    if len({t.name for t in tools}) < len(tools):
        raise invalid("'tools' names a tool twice.", "tools")
    return tools


def _tool_choice(body: dict, tools: list[pb.Tool], chat: pb.ChatInput) -> None:
    value = body.get("tool_choice")
    if value is None:
        return
    choice = dict_value(value, "tool_choice")
    kind = choice.get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICES:
        raise invalid(f"'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', got {json.dumps(kind)}.",
                      "tool_choice.type")
    if kind in ("any", "tool") and not tools:
        raise invalid(f"'tool_choice' is '{kind}' but no 'tools' were given.", "tool_choice")
    chat.tool_choice.mode = _TOOL_CHOICES[kind]
    if kind == "tool":
        name = str_value(choice.get("name"), "tool_choice.name", allow_empty=False)
        if name not in {t.name for t in tools}:
            raise invalid(f"'tool_choice' names the tool '{name}', which is not in 'tools'.", "tool_choice.name")
        chat.tool_choice.function_name = name
    if bool_field(choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"):
        chat.parallel_tool_calls = False


def _format(value: Any, param: str) -> pb.Constraint | None:
    if value is None:
        return None
    fmt = dict_value(value, param)
    if fmt.get("type") != "json_schema":
        raise invalid(f"'{param}.type' must be 'json_schema', got {json.dumps(fmt.get('type'))}.", f"{param}.type")
    if fmt.get("schema") is None:
        raise invalid(f"'{param}.schema' is required.", f"{param}.schema")
    return pb.Constraint(json_schema=schema_text(fmt["schema"], f"{param}.schema"))


def _constraint(body: dict) -> pb.Constraint | None:
    """`output_config.format`, or the beta's top-level `output_format`."""
    config = body.get("output_config")
    from_config = None
    if config is not None:
        config = dict_value(config, "output_config")
        if config.get("effort") is not None:
            str_value(config["effort"], "output_config.effort", allow_empty=False)
        from_config = _format(config.get("format"), "output_config.format")
    from_beta = _format(body.get("output_format"), "output_format")
    if from_config is not None and from_beta is not None:
        raise invalid("Use either 'output_config.format' or 'output_format', not both.", "output_format")
    return from_config or from_beta


def _thinking(body: dict) -> tuple[str, int | None]:
    """The reasoning effort and thinking budget `thinking` asks for (see the module's docstring)."""
    if body.get("thinking") is None:
        return "", None
    thinking = dict_value(body["thinking"], "thinking")
    kind = thinking.get("type")
    if kind not in _THINKING:
        raise invalid(f"'thinking.type' must be 'adaptive', 'enabled' or 'disabled', got {json.dumps(kind)}.",
                      "thinking.type")
    if kind == "enabled":
        return "high", int_field(thinking, "budget_tokens", 1, 2**31 - 1, "thinking.budget_tokens")
    return ("none" if kind == "disabled" else ""), None


def _given_back_thinking(block: dict, param: str) -> None:
    """An earlier turn's thinking: checked, then dropped (see the module's docstring)."""
    if block["type"] == "redacted_thinking":
        str_value(block.get("data"), f"{param}.data")
        return
    str_value(block.get("thinking"), f"{param}.thinking")
    if not isinstance(block.get("signature"), str):
        raise invalid(f"'{param}.signature': a thinking block given back needs the signature it came with.",
                      f"{param}.signature")


def _refuse_unservable(body: dict) -> None:
    if body.get("mcp_servers"):
        raise invalid("'mcp_servers' is not supported: this server connects to no MCP server.", "mcp_servers")
    _cache_control(body.get("cache_control"), "cache_control")


def chat_parts(body: dict, limits: RequestLimits = DEFAULT_LIMITS) -> ChatParts:
    """The model, rendered chat and answer format of a Messages (or count_tokens) body."""
    model = model_field(body)
    _refuse_unservable(body)
    effort, budget = _thinking(body)
    messages = _chat_messages(body, limits)
    tools = _tools(body)
    check_prompt_chars(chat_prompt_chars(messages, tools), "messages", limits)
    chat = pb.ChatInput(messages=messages, tools=tools, reasoning_effort=effort)
    _tool_choice(body, tools, chat)
    return ChatParts(model, chat, _constraint(body), budget)


# ------------------------------------------------------------------ requests


def _sampling(body: dict) -> pb.SamplingParams:
    params = pb.SamplingParams()
    temperature = number_field(body, "temperature", TEMPERATURE_RANGE)
    if temperature is not None:
        params.temperature = temperature
    top_p = number_field(body, "top_p", SAMPLING_RANGES["top_p"])
    if top_p is not None:
        params.top_p = top_p
    top_k = int_field(body, "top_k", 0, 2**31 - 1)
    if top_k is not None:
        params.top_k = top_k
    return params


def _stop_sequences(body: dict, limits: RequestLimits) -> list[str]:
    value = body.get("stop_sequences")
    if value is None:
        return []
    stops = list_value(value, "stop_sequences", allow_empty=True)
    if len(stops) > limits.max_stop:
        raise invalid(f"'stop_sequences' may hold at most {limits.max_stop} strings on this server, "
                      f"got {len(stops)}.", "stop_sequences")
    return [str_value(s, f"stop_sequences[{i}]", allow_empty=False) for i, s in enumerate(stops)]


def parse_messages(body: dict, request_id: str, limits: RequestLimits = DEFAULT_LIMITS) -> MessagesPlan:
    """Validate a /v1/messages body and build its GenerateRequest."""
    parts = chat_parts(body, limits)
    if body.get("max_tokens") is None:
        raise invalid("'max_tokens' is required.", "max_tokens")
    max_tokens = max_tokens_field(body, ("max_tokens",), 1, limits)
    metadata = body.get("metadata")
    if metadata is not None and dict_value(metadata, "metadata").get("user_id") is not None:
        str_value(metadata["user_id"], "metadata.user_id")
    stops = _stop_sequences(body, limits)
    request = pb.GenerateRequest(
        request_id=request_id,
        model=parts.model,
        chat=parts.chat,
        sampling=_sampling(body),
        stopping=pb.StoppingParams(max_tokens=max_tokens, stop=stops),
    )
    if parts.constraint is not None:
        request.constraint.CopyFrom(parts.constraint)
    if parts.thinking_budget is not None:
        request.max_reasoning_tokens = parts.thinking_budget
    return MessagesPlan(parts.model, request, bool(bool_field(body, "stream")), stops)


def parse_count_tokens(body: dict, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[str, pb.TokenizeRequest]:
    """Validate a /v1/messages/count_tokens body: the model and the TokenizeRequest that renders
    the prompt exactly as the same /v1/messages request would."""
    parts = chat_parts(body, limits)
    request = pb.TokenizeRequest(model=parts.model, chat=parts.chat)
    if parts.constraint is not None:
        request.constraint.CopyFrom(parts.constraint)
    return parts.model, request
