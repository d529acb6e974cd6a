"""Building engine requests from plain Python values.

The generated messages are precise but verbose (`optional` fields, oneofs,
nested parameter messages); these helpers let callers write
`messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=32`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from conduit.v1 import engine_pb2 as pb

Message = Mapping[str, Any] | pb.ChatMessage
ToolSpec = Mapping[str, Any] | pb.Tool

_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)
_STOPPING_FIELDS = frozenset(pb.StoppingParams.DESCRIPTOR.fields_by_name)
# tool_choice strings (OpenAI's spelling) -> ToolChoice modes; any other string names a function.
TOOL_CHOICE_MODES = {
    "auto": pb.ToolChoice.MODE_AUTO,
    "none": pb.ToolChoice.MODE_NONE,
    "required": pb.ToolChoice.MODE_REQUIRED,
}


def chat_message(message: Message) -> pb.ChatMessage:
    """A ChatMessage from a dict shaped like the proto (tool_calls as dicts too)."""
    if isinstance(message, pb.ChatMessage):
        return message
    fields = dict(message)
    calls = [pb.ToolCall(**call) for call in fields.pop("tool_calls", None) or ()]
    return pb.ChatMessage(tool_calls=calls, **fields)


def tool(spec: ToolSpec) -> pb.Tool:
    """A Tool from {"name", "description", "parameters": <JSON Schema dict or text>}."""
    if isinstance(spec, pb.Tool):
        return spec
    parameters = spec.get("parameters", "")
    if not isinstance(parameters, str):
        parameters = json.dumps(parameters)
    return pb.Tool(name=spec["name"], description=spec.get("description", ""),
                   parameters_json=parameters)


def tool_choice_message(choice: str) -> pb.ToolChoice:
    """"auto", "none", "required", or a function name that must be called."""
    if choice in TOOL_CHOICE_MODES:
        return pb.ToolChoice(mode=TOOL_CHOICE_MODES[choice])
    return pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name=choice)


def chat_input(messages: Iterable[Message], tools: Sequence[ToolSpec] = (),
               tool_choice: str | None = None,
               parallel_tool_calls: bool | None = None) -> pb.ChatInput:
    """The chat oneof shared by Generate and Tokenize."""
    chat = pb.ChatInput(messages=[chat_message(m) for m in messages],
                        tools=[tool(t) for t in tools])
    if tool_choice is not None:
        chat.tool_choice.CopyFrom(tool_choice_message(tool_choice))
    if parallel_tool_calls is not None:
        chat.parallel_tool_calls = parallel_tool_calls
    return chat


def constraint(*, json_object: bool = False, json_schema: Mapping[str, Any] | str | None = None,
               regex: str | None = None, grammar: str | None = None) -> pb.Constraint | None:
    """At most one constraint; None when none is asked for."""
    chosen = [name for name, value in (("json_object", json_object), ("json_schema", json_schema),
                                       ("regex", regex), ("grammar", grammar)) if value]
    if len(chosen) > 1:
        raise ValueError(f"pick one constraint, got {chosen}")
    if json_object:
        return pb.Constraint(json_object=True)
    if json_schema is not None:
        text = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        return pb.Constraint(json_schema=text)
    if regex is not None:
        return pb.Constraint(regex=regex)
    if grammar is not None:
        return pb.Constraint(grammar=grammar)
    return None


def build_request(
    *,
    messages: Iterable[Message] | None = None,
    prompt: str | None = None,
    token_ids: Sequence[int] | None = None,
    model: str = "",
    request_id: str = "",
    n: int | None = None,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str | None = None,
    parallel_tool_calls: bool | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    echo: bool = False,
    json_object: bool = False,
    json_schema: Mapping[str, Any] | str | None = None,
    regex: str | None = None,
    grammar: str | None = None,
    **params: Any,
) -> pb.GenerateRequest:
    """A GenerateRequest; `params` are SamplingParams and StoppingParams fields by name.

    Exactly one of messages (chat), prompt (plain text) or token_ids is needed.
    Unset parameters stay unset, so the engine's documented defaults apply.
    """
    inputs = [name for name, value in (("messages", messages), ("prompt", prompt),
                                       ("token_ids", token_ids)) if value is not None]
    if len(inputs) != 1:
        raise ValueError(f"give exactly one of messages, prompt, token_ids (got {inputs or 'none'})")
    request = pb.GenerateRequest(model=model, request_id=request_id, logprobs=logprobs,
                                 top_logprobs=top_logprobs, echo=echo)
    if messages is not None:
        request.chat.CopyFrom(chat_input(messages, tools, tool_choice, parallel_tool_calls))
    elif prompt is not None:
        request.text = prompt
    else:
        request.token_ids.ids.extend(token_ids or ())
    if n is not None:
        request.n = n
    for name, value in params.items():
        if value is None:
            continue
        if name in _SAMPLING_FIELDS:
            _set_field(request.sampling, name, value)
        elif name in _STOPPING_FIELDS:
            _set_field(request.stopping, name, [value] if name == "stop" and isinstance(value, str) else value)
        else:
            raise TypeError(f"unknown generation parameter {name!r}")
    chosen = constraint(json_object=json_object, json_schema=json_schema, regex=regex, grammar=grammar)
    if chosen is not None:
        request.constraint.CopyFrom(chosen)
    return request


def tokenize_request(*, text: str | None = None, messages: Iterable[Message] | None = None,
                     model: str = "", tools: Sequence[ToolSpec] = ()) -> pb.TokenizeRequest:
    """A TokenizeRequest for either plain text or a chat (rendered by the engine's template)."""
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text, messages")
    if text is not None:
        return pb.TokenizeRequest(model=model, text=text)
    return pb.TokenizeRequest(model=model, chat=chat_input(messages or (), tools))


def embed_request(inputs: str | Sequence[str | Sequence[int]], *, model: str = "", dimensions: int | None = None,
                  truncate_prompt_tokens: int | None = None, request_id: str = "") -> pb.EmbedRequest:
    """An EmbedRequest: each input a text or a list of the model's token ids (one text alone is a batch of one)."""
    items = [inputs] if isinstance(inputs, str) else inputs
    request = pb.EmbedRequest(model=model, request_id=request_id, inputs=[
        pb.EmbedInput(text=item) if isinstance(item, str) else pb.EmbedInput(token_ids=pb.TokenIds(ids=item))
        for item in items])
    if dimensions is not None:
        request.dimensions = dimensions
    if truncate_prompt_tokens is not None:
        request.truncate_prompt_tokens = truncate_prompt_tokens
    return request


def _set_field(message: Any, name: str, value: Any) -> None:
    """Assign a scalar, extend a repeated field or update a map, as the field needs."""
    field = getattr(message, name)
    if isinstance(value, Mapping):
        field.update({int(k): float(v) for k, v in value.items()})
    elif isinstance(value, (list, tuple)):
        field.extend(value)
    else:
        setattr(message, name, value)
