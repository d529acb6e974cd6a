"""The Messages API's request bodies as typed models (named as Anthropic's SDK names them): the one
definition of both validation (`parse`) and the /openapi.json document (`MESSAGES_API`).

What the engine cannot serve is refused with a 400 naming it, in the words Anthropic's clients know: a
block of another type (image, document, ...: `OtherBlock`) or in a role that cannot hold it (`_PLACES`),
a server tool, a role outside user/assistant/system, a final assistant turn (a prefill), MCP servers.
Unknown fields are ignored at every level.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PlainValidator, model_validator
from pydantic.json_schema import SkipJsonSchema

from conduit.v1.contract import SAMPLING_RANGES, Range

from ..protocol.base import (ApiModel, Bool, Cap, ModelId, NonEmptyStr, Object, Str, by_type, fail, got,
                              int_in, number_in, one_of, text_or)
from ..protocol.chat import JsonSchemaText, ToolName
from ..protocol.openapi import REQUEST_ID_HEADER, ApiPart, Operation, ref
from ..protocol.sampling import MaxTokens
from .errors import OVERLOADED_STATUS, error_type

INT32_MAX = 2**31 - 1


# A string among the values given, refused in the Messages API's words ("must be 'a', 'b' or 'c', got ...").
literal = partial(one_of, wording="'{param}' must be {words}, got {got}.")


# The blocks each role's content may hold; `_refusal` words why another cannot stand there.
_PLACES = {"user": {"text", "tool_result"}, "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
          "system": {"text"}}


def _refusal(kind: str, role: str) -> str | None:
    """Why a block of `kind` cannot stand in a `role` message's content (a template, {param}: the block)."""
    if kind in _PLACES[role]:
        return None
    if kind in ("thinking", "redacted_thinking"):
        return "'{param}' is a {kind} block: thinking blocks belong in assistant messages."
    if kind in ("tool_result", "tool_use") and role != "system":
        return "'{param}': {kind} blocks belong in " + ("user" if kind == "tool_result" else "assistant") + " messages."
    return ("Content blocks of type {got} are not supported by this server: it serves text, tool_use and "
            "tool_result blocks.")


def _check_places(content: str | list[ApiModel], role: str, *where: str) -> None:
    for j, block in enumerate([] if isinstance(content, str) else content):
        template = _refusal(block.type, role)
        if template is not None:
            raise fail(template, field=(*where, j), kind=block.type, got=got(block.type))


def _text_blocks_only(value: str | list[ApiModel]) -> str | list[ApiModel]:
    _check_places(value, "system")
    return value


def _no_mcp_servers(value: Any) -> Any:
    if value:
        raise fail("'{param}' is not supported: this server connects to no MCP server.")
    return value


class CacheControlEphemeralParam(ApiModel):
    """Accepted (the engine's prefix cache serves every request); checked, so a typo is not taken for a mark."""

    type: literal("ephemeral")


class TextBlockParam(ApiModel):
    type: literal("text")
    text: Str
    cache_control: CacheControlEphemeralParam | None = None


class ToolUseBlockParam(ApiModel):
    type: literal("tool_use")
    id: NonEmptyStr
    name: NonEmptyStr
    input: Object
    cache_control: CacheControlEphemeralParam | None = None


class OtherBlock(ApiModel):
    """A block of a type this server does not serve (image, document, ...), parsed to be refused by name."""

    type: Str


# System prompts and tool results: text blocks only, as a system message holds.
TextOrTextBlocks = Annotated[text_or(by_type({"text": TextBlockParam}, OtherBlock, shown=1), 1, "content blocks"),
                             AfterValidator(_text_blocks_only)]


class ToolResultBlockParam(ApiModel):
    type: literal("tool_result")
    tool_use_id: NonEmptyStr
    content: TextOrTextBlocks | None = None
    is_error: Bool | None = None
    cache_control: CacheControlEphemeralParam | None = None


class ThinkingBlockParam(ApiModel):
    type: literal("thinking")
    thinking: Str
    signature: Str | None = None  # required; its absence refused in Anthropic's words

    @model_validator(mode="after")
    def _signed(self) -> ThinkingBlockParam:
        if self.signature is None:
            raise fail("'{param}': a thinking block given back needs the signature it came with.", field="signature")
        return self


class RedactedThinkingBlockParam(ApiModel):
    type: literal("redacted_thinking")
    data: Str


ContentBlock = by_type({"text": TextBlockParam, "tool_use": ToolUseBlockParam, "tool_result": ToolResultBlockParam,
                        "thinking": ThinkingBlockParam, "redacted_thinking": RedactedThinkingBlockParam},
                       OtherBlock, shown=3)


class MessageParam(ApiModel):
    # Anthropic's own validation message, which clients match on.
    role: literal("user", "assistant", "system", wording="{path}: Input should be {words}, got {got}.")
    content: text_or(ContentBlock, 1, "content blocks")

    @model_validator(mode="after")
    def _blocks_in_place(self) -> MessageParam:
        _check_places(self.content, self.role, "content")
        return self


class ToolParam(ApiModel):
    type: literal("custom") | None = None
    name: ToolName
    description: Str = ""
    input_schema: JsonSchemaText
    cache_control: CacheControlEphemeralParam | None = None
    defer_loading: Bool | None = None  # true: kept out of the prompt until a tool search finds it


class ServerTool(ApiModel):
    """A tool Anthropic runs itself (web search, code execution, ...): refused, named."""

    type: Str

    @model_validator(mode="after")
    def _refused(self) -> ServerTool:
        raise fail("'{param}' is a server tool ({got}), which this server does not run: define client tools with "
                   "name, description and input_schema.", got=got(self.type))


class ToolChoiceParam(ApiModel):
    type: literal("auto", "any", "tool", "none")
    name: NonEmptyStr | None = None  # for type "tool"
    disable_parallel_tool_use: Bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if self.type == "tool" and self.name is None:
            raise fail("'{param}' is required.", field="name")
        return self


class JSONOutputFormatParam(ApiModel):
    type: literal("json_schema")
    schema_: JsonSchemaText = Field(alias="schema")


class OutputConfigParam(ApiModel):
    format: JSONOutputFormatParam | None = None
    effort: NonEmptyStr | None = None  # a hint


class ThinkingConfigParam(ApiModel):
    type: literal("adaptive", "enabled", "disabled")
    budget_tokens: int_in(1, INT32_MAX) | None = None  # for "enabled"; the engine enforces it


class MetadataParam(ApiModel):
    user_id: Str | None = None


class CountTokensRequest(ApiModel):
    """A Messages request's prompt and answer format, which count_tokens counts as /v1/messages renders them."""

    model: ModelId
    messages: Annotated[list[MessageParam], Field(min_length=1, description="the last message must be a user turn"),
                        Cap("max_messages", "maxItems", "messages")]
    system: TextOrTextBlocks | None = None
    tools: list[by_type({"custom": ToolParam}, ServerTool, shown=1, default="custom")] | None = None
    tool_choice: ToolChoiceParam | None = None
    output_config: OutputConfigParam | None = None
    output_format: JSONOutputFormatParam | None = None  # the structured-outputs beta's spelling
    thinking: ThinkingConfigParam | None = None
    cache_control: CacheControlEphemeralParam | None = None
    mcp_servers: SkipJsonSchema[Annotated[Any, PlainValidator(_no_mcp_servers)]] = None

    @model_validator(mode="after")
    def _ends_with_a_user_turn(self) -> CountTokensRequest:
        if self.messages[-1].role == "assistant":
            raise fail("The last message is an assistant turn (a prefill), which this server cannot continue: end "
                       "with a user message.", field=("messages", len(self.messages) - 1, "role"))
        return self


class MessagesRequest(CountTokensRequest):
    max_tokens: MaxTokens
    stop_sequences: Annotated[list[NonEmptyStr], Cap("max_stop", "maxItems", "strings")] | None = None
    temperature: number_in(Range(0.0, 1.0)) | None = None  # Anthropic's range, narrower than the engine's
    top_p: number_in(SAMPLING_RANGES["top_p"]) | None = None
    top_k: int_in(0, INT32_MAX) | None = None
    metadata: MetadataParam | None = None
    stream: Bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_tokens_given(cls, value: Any) -> Any:  # in this API's words (the base's are OpenAI's for a model)
        if isinstance(value, dict) and value.get("max_tokens") is None:
            raise fail("'{param}' is required.", field="max_tokens")
        return value


def _answers() -> dict[str, Any]:
    usage = {"type": "object", "properties": {name: {"type": "integer"} for name in (
        "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}}
    return {
        "Message": {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                    "properties": {
                        "id": {"type": "string"}, "type": {"type": "string", "enum": ["message"]},
                        "role": {"type": "string", "enum": ["assistant"]}, "model": {"type": "string"},
                        "content": {"type": "array", "items": {"type": "object"}},
                        "stop_reason": {"type": "string", "enum": [
                            "end_turn", "max_tokens", "stop_sequence", "tool_use"]},
                        "stop_sequence": {"type": "string", "nullable": True}, "usage": usage}},
        "MessageTokensCount": {"type": "object", "required": ["input_tokens"],
                               "properties": {"input_tokens": {"type": "integer"}}},
        "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
            "type": {"type": "string", "enum": ["error"]},
            "error": {"type": "object", "required": ["type", "message"],
                      "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
            "request_id": {"type": "string"}}},
    }


_VERSION_HEADER = {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"},
                   "description": "accepted; Anthropic's clients send it (errors and /v1/models then take Anthropic's "
                                  "shape)"}


def _operation(path: str, summary: str, request: type[ApiModel], response: str, streams: str = "") -> Operation:
    """A route answering errors in Anthropic's shape, each status with its error type."""
    content = {"application/json": {"schema": ref("AnthropicError")}}
    errors = {str(status): {"description": error_type(status), "content": content}
              for status in (400, 401, 404, 413, 429, 500, 502, 504, OVERLOADED_STATUS)}
    return Operation(path, summary, request, response, streams, (REQUEST_ID_HEADER, _VERSION_HEADER), errors)


MESSAGES_API = ApiPart(
    operations=(
        _operation("/v1/messages", "Anthropic Messages API", MessagesRequest, "Message",
                   streams="events from message_start to message_stop"),
        _operation("/v1/messages/count_tokens", "Tokens of a Messages request's prompt", CountTokensRequest,
                   "MessageTokensCount"),
    ),
    schemas=_answers(),
)
