"""Turns a request's input (chat messages, text or token ids) into prompt token ids."""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING

from jinja2 import TemplateError

from conduit.v1 import engine_pb2 as pb
from engine_service.core.params import InvalidRequest
from engine_service.text import reasoning
from engine_service.text.tools import ToolSpec

if TYPE_CHECKING:  # transformers loads only where a model does (the fast tests need neither)
    from transformers import PreTrainedTokenizerBase

CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


def chat_messages(chat: pb.ChatInput) -> list[dict]:
    """Proto messages -> the dicts chat templates expect (developer folds into system)."""
    if not chat.messages:
        raise InvalidRequest("messages must not be empty", "chat.messages")
    out: list[dict] = []
    for i, msg in enumerate(chat.messages):
        if msg.role not in CHAT_ROLES:
            raise InvalidRequest(f"messages[{i}].role {msg.role!r} is not one of {sorted(CHAT_ROLES)}",
                                 "chat.messages")
        item: dict = {"role": "system" if msg.role == "developer" else msg.role, "content": msg.content}
        if msg.name:
            item["name"] = msg.name
        if msg.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
                for c in msg.tool_calls
            ]
        if msg.tool_call_id:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out


def _json_or_text(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def template_knows_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the model's chat template renders `tools`, and so earlier calls and their results,
    itself (in its own call format); if not, our tool prompt describes them and asks for
    `<tool_call>` tags. A property of the template: a request without tools (the turn asking for the
    final answer after calls) still has its earlier calls and results rendered by the template."""
    return tokenizer.chat_template is not None and "tools" in tokenizer.chat_template


def render_chat(tokenizer: PreTrainedTokenizerBase, chat: pb.ChatInput, answer_format: pb.Constraint | None = None) -> str:
    if tokenizer.chat_template is None:
        raise InvalidRequest("this model has no chat template, so it cannot take chat messages: send text or "
                             "token ids (/v1/completions), or start the engine with --chat-template FILE", "chat")
    messages = chat_messages(chat)
    spec = ToolSpec.from_chat(chat)
    kwargs: dict = reasoning_kwargs(tokenizer, chat)
    if template_knows_tools(tokenizer):
        if spec is not None:
            kwargs["tools"] = spec.openai_tools()
    else:
        messages = _without_tool_fields(messages, spec, answer_format)
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    except TemplateError as exc:
        raise InvalidRequest(f"the chat template rejected these messages: {exc}", "chat.messages") from exc
    except (TypeError, ValueError) as exc:
        if not chat.chat_template_kwargs:  # the engine's own fault: INTERNAL, as before
            raise
        raise InvalidRequest(f"the chat template failed with these chat_template_kwargs: {exc}",
                             "chat.chat_template_kwargs") from exc


def reasoning_kwargs(tokenizer: PreTrainedTokenizerBase, chat: pb.ChatInput) -> dict:
    """The template arguments of reasoning_effort (on the template's own switches) and of
    chat_template_kwargs (which win)."""
    kwargs: dict = {}
    if chat.reasoning_effort:
        if chat.reasoning_effort not in reasoning.EFFORTS:
            raise InvalidRequest(f"reasoning_effort must be one of {', '.join(reasoning.EFFORTS)}, not "
                                 f"{chat.reasoning_effort!r}", "chat.reasoning_effort")
        variables = reasoning.template_variables(tokenizer.chat_template)
        kwargs.update(reasoning.template_kwargs(variables, chat.reasoning_effort))
    if chat.chat_template_kwargs:
        try:
            extra = json.loads(chat.chat_template_kwargs)
        except ValueError as exc:
            raise InvalidRequest(f"chat_template_kwargs is not valid JSON: {exc}", "chat.chat_template_kwargs") from exc
        if not isinstance(extra, dict):
            raise InvalidRequest("chat_template_kwargs must be a JSON object", "chat.chat_template_kwargs")
        # apply_chat_template's own arguments are not the template's to take.
        own = set(inspect.signature(tokenizer.apply_chat_template).parameters) - {"kwargs"} | {"messages"}
        reserved = own & extra.keys()
        if reserved:
            raise InvalidRequest(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}",
                                 "chat.chat_template_kwargs")
        kwargs.update(extra)
    return kwargs


def _without_tool_fields(messages: list[dict], spec: ToolSpec | None, answer_format: pb.Constraint | None) -> list[dict]:
    """For templates that know nothing of tools: describe them in the system prompt, write earlier
    calls as the <tool_call> text the prompt asks for, and results in the <tool_response> tags that
    pair with it (Hermes' convention; a bare result reads to a small model as a cue to call again)."""
    out = []
    for msg in messages:
        msg = dict(msg)
        calls = msg.pop("tool_calls", None)
        if calls:
            written = "\n".join(
                "<tool_call>" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                + "</tool_call>" for c in calls)
            msg["content"] = (msg["content"] + "\n" + written).strip()
        msg.pop("tool_call_id", None)
        if msg["role"] == "tool":
            msg["content"] = f"<tool_response>{msg['content']}</tool_response>"
        out.append(msg)
    if spec is not None:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + spec.system_prompt(answer_format)}
        else:
            out.insert(0, {"role": "system", "content": spec.system_prompt(answer_format)})
    return out


def chat_ids(tokenizer: PreTrainedTokenizerBase, chat: pb.ChatInput, answer_format: pb.Constraint | None) -> list[int]:
    # The template already wrote any special tokens the model expects.
    return tokenizer(render_chat(tokenizer, chat, answer_format), add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, request: pb.GenerateRequest | pb.TokenizeRequest) -> list[int]:
    kind = request.WhichOneof("input")
    if kind == "chat":
        return chat_ids(tokenizer, request.chat, request.constraint)
    if kind == "text":
        if not request.text:
            raise InvalidRequest("the prompt text is empty", "text")
        return tokenizer(request.text, add_special_tokens=True)["input_ids"]
    if kind == "token_ids":
        return list(request.token_ids.ids)
    raise InvalidRequest("the request has no input: set chat, text or token_ids", "input")
