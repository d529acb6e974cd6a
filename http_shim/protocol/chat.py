"""Chat-shaped pieces every generation API shares: tool names and JSON Schemas as text, the vendor
`structured_outputs` constraint, tool_choice and reasoning options onto a ChatInput, and the operator's
cap on prompt text."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Union

from pydantic import Field, PlainValidator, StringConstraints, TypeAdapter, ValidationInfo, WithJsonSchema, \
    model_validator

from clients.request_builder import TOOL_CHOICE_MODES
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import REASONING_EFFORTS

from ..errors import invalid
from ..limits import RequestLimits
from .base import ApiModel, NonEmptyStr, fail, got, one_of

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ReasoningEffort = one_of(*REASONING_EFFORTS)


ToolName = Annotated[str, StringConstraints(strict=True, pattern=TOOL_NAME.pattern)]


def schema_text(schema: Any) -> str:
    """A JSON Schema (an object, a boolean, or either as a JSON string) as JSON text for the engine."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise fail("'{param}' is not valid JSON.") from None
    if not isinstance(schema, (dict, bool)):
        raise fail("'{param}' must be a JSON Schema object.")
    return json.dumps(schema)


JsonSchemaText = Annotated[str, PlainValidator(schema_text), WithJsonSchema({"type": "object",
                                                                              "description": "a JSON Schema"})]


class StructuredOutputs(ApiModel):
    """Vendor constraints OpenAI has no field for (vLLM's): exactly one of regex, grammar (Lark), json."""

    model_config = {"json_schema_extra": {"minProperties": 1, "maxProperties": 1}}

    regex: NonEmptyStr | None = None
    grammar: NonEmptyStr | None = None
    json_: JsonSchemaText | None = Field(None, alias="json")  # `json` would shadow BaseModel.json

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        if [self.regex, self.grammar, self.json_].count(None) != 2:
            raise fail("'{param}' must set exactly one of 'regex', 'grammar' or 'json'.")
        return self

    def constraint(self) -> pb.Constraint:
        # Exactly one is set; the others (None) leave their member of the oneof unset.
        return pb.Constraint(json_schema=self.json_, regex=self.regex, grammar=self.grammar)



def mode_or(choice: Any, *shown: Any) -> Any:
    """A `tool_choice` field: a mode (none, auto, required) or an object parsed as `choice` (a model, or a
    `by_type`); the document shows the modes and the `shown` models."""
    adapter = TypeAdapter(choice)

    def check(value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return adapter.validate_python(value, context=info.context)  # its errors merge in below tool_choice
        if value not in TOOL_CHOICE_MODES:
            raise fail("'{param}' must be 'none', 'auto', 'required' or an object, got {got}.", got=got(value))
        return value

    return Annotated[Any, PlainValidator(check, json_schema_input_type=Union[one_of(*TOOL_CHOICE_MODES), *shown])]


def tool_choice(choice: str | None, function: str | None, tools: list[pb.Tool]) -> pb.ToolChoice:
    """A ChatInput's tool choice: a mode (none, auto, required; None: auto) or one named function, which
    must be among `tools`; raises the 400 naming `tool_choice`."""
    if function is not None:
        if function not in {t.name for t in tools}:
            raise invalid(f"'tool_choice' names the function '{function}', which is not in 'tools'.", "tool_choice")
        return pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name=function)
    if choice == "required" and not tools:
        raise invalid("'tool_choice' is 'required' but no 'tools' were given.", "tool_choice")
    return pb.ToolChoice(mode=TOOL_CHOICE_MODES[choice or "auto"])


def reasoning_options(chat: pb.ChatInput, effort: str | None, template_kwargs: dict | None) -> None:
    """reasoning_effort and chat_template_kwargs (docs/reasoning.md) onto the chat."""
    if effort is not None:
        chat.reasoning_effort = effort
    if template_kwargs is not None:
        chat.chat_template_kwargs = json.dumps(template_kwargs)


def chat_prompt_chars(messages: list[pb.ChatMessage], tools: list[pb.Tool]) -> int:
    """Characters the chat prompt is rendered from: message contents, names and tool-call
    arguments, and the tools' names, descriptions and parameter schemas."""
    chars = sum(len(t.name) + len(t.description) + len(t.parameters_json) for t in tools)
    for m in messages:
        chars += len(m.content) + len(m.name) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return chars


def check_prompt_chars(chars: int, param: str, limits: RequestLimits) -> None:
    if chars > limits.max_prompt_chars:
        raise invalid(f"'{param}' may hold at most {limits.max_prompt_chars} characters of prompt text on this "
                      f"server, got {chars}.", param)
