"""The Messages API's request bodies as typed models (named as Anthropic's SDK names them): the one
definition both validation (`parse`) and the /openapi.json document (`MESSAGES_API`) come from;
request.py turns a validated body into the engine's request.

Shapes the engine cannot serve are still parsed where their refusal should name them: a content block
of another type (image, document, ...) as `OtherBlock`, a tool of another type (a server tool) as
`ServerTool`, any string as a role; request.py refuses each with a 400 naming it and its place
(Anthropic's own wording for a role). The document shows what is served. Unknown fields are ignored
at every level (request.py's docstring names those that are hints).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, PlainValidator, TypeAdapter, ValidationInfo, WithJsonSchema, model_validator
from pydantic.json_schema import SkipJsonSchema

from conduit.v1.contract import SAMPLING_RANGES, Range

from ..protocol.base import ApiModel, Bool, Cap, ModelId, NonEmptyStr, Object, Str, fail, got, int_in, number_in
from ..protocol.chat import JsonSchemaText, ToolName
from ..protocol.openapi import REQUEST_ID_HEADER, ApiPart, Operation, ref

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
ROLES = ("user", "assistant", "system")


def literal(*values: str, wording: str = "'{param}' must be {words}, got {got}.") -> Any:
    """A string among `values`, refused in the Messages API's words ("must be 'a', 'b' or 'c', got ...")."""
    quoted = [f"'{v}'" for v in values]
    words = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(values) > 1 else quoted[0]

    def check(value: Any) -> str:
        if value not in values:
            raise fail(wording, words=words, got=got(value))
        return value

    return Annotated[str, PlainValidator(check), WithJsonSchema({"type": "string", "enum": list(values)})]


def by_type(members: dict[str, type[ApiModel]], other: type[ApiModel], shown: int, default: str | None = None) -> Any:
    """An object of the model its `type` names (`default` when it has none), any other type parsed as
    `other`; the document shows the first `shown` members. (Not pydantic's tagged union, whose tag would
    enter the param path.)"""

    def check(value: Any, info: ValidationInfo) -> ApiModel:
        kind = value.get("type") if isinstance(value, dict) else None
        kind = default if kind is None else kind
        model = members.get(kind, other) if isinstance(kind, str) else other
        return model.model_validate(value, context=info.context)  # its errors named below this value

    shown_as = Union[tuple(list(members.values())[:shown])]
    return Annotated[Any, PlainValidator(check, json_schema_input_type=shown_as)]


def text_or(block: Any) -> Any:
    """A string, or a non-empty array of `block`s."""
    blocks = Annotated[list[block], Field(min_length=1)]
    adapter = TypeAdapter(blocks)

    def check(value: Any, info: ValidationInfo) -> str | list[ApiModel]:
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise fail("'{param}' must be a string or an array of content blocks.")
        return adapter.validate_python(value, context=info.context)

    return Annotated[Any, PlainValidator(check, json_schema_input_type=Union[str, blocks])]


def _no_mcp_servers(value: Any) -> Any:
    if value:
        raise fail("'{param}' is not supported: this server connects to no MCP server.")
    return value


# ------------------------------------------------------------------ content


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
    """A block of a type this server does not serve (image, document, ...), parsed to be named."""

    type: Str


TextOrTextBlocks = text_or(by_type({"text": TextBlockParam}, OtherBlock, shown=1))


class ToolResultBlockParam(ApiModel):
    type: literal("tool_result")
    tool_use_id: NonEmptyStr
    content: TextOrTextBlocks | None = None
    is_error: Bool | None = None
    cache_control: CacheControlEphemeralParam | None = None


class ThinkingBlockParam(ApiModel):
    type: literal("thinking")
    thinking: Str
    signature: Str | None = None  # required, refused in Anthropic's words:

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
    role: literal(*ROLES, wording="{path}: Input should be {words}, got {got}.")
    content: text_or(ContentBlock)


# ------------------------------------------------------------------ tools, format, thinking


class ToolParam(ApiModel):
    type: literal("custom") | None = None
    name: ToolName
    description: Str = ""
    input_schema: JsonSchemaText
    cache_control: CacheControlEphemeralParam | None = None
    defer_loading: Bool | None = None  # true: kept out of the prompt until a tool search finds it


class ServerTool(ApiModel):
    """A tool Anthropic runs itself (web search, code execution, ...), parsed to be named."""

    type: Str


class ToolChoiceParam(ApiModel):
    type: literal("auto", "any", "tool", "none")
    name: NonEmptyStr | None = None  # for type "tool"
    disable_parallel_tool_use: Bool | None = None


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


# ------------------------------------------------------------------ requests


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
    max_tokens: Annotated[int_in(1, UINT32_MAX), Cap("max_tokens")]
    stop_sequences: Annotated[list[NonEmptyStr], Cap("max_stop", "maxItems", "strings")] | None = None
    temperature: number_in(Range(0.0, 1.0)) | None = None  # Anthropic's range, narrower than the engine's
    top_p: number_in(SAMPLING_RANGES["top_p"]) | None = None
    top_k: int_in(0, INT32_MAX) | None = None
    metadata: MetadataParam | None = None
    stream: Bool | None = None


# ------------------------------------------------------------------ the document


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


_ERRORS = {
    400: "invalid_request_error", 401: "authentication_error (x-api-key or Bearer)", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error: the engine's queue is full (Retry-After)",
    500: "api_error (the message names the request id)", 502: "api_error: the engine refused this server",
    504: "timeout_error", 529: "overloaded_error: the engine is unavailable or this server is shutting down",
}
_VERSION_HEADER = {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"},
                   "description": "accepted; Anthropic's clients send it (errors and /v1/models then take Anthropic's "
                                  "shape)"}


def _operation(path: str, summary: str, request: type[ApiModel], response: str, streams: str = "") -> Operation:
    content = {"application/json": {"schema": ref("AnthropicError")}}
    return Operation(path, summary, request, response, streams, parameters=(REQUEST_ID_HEADER, _VERSION_HEADER),
                     errors={str(status): {"description": what, "content": content} for status, what in _ERRORS.items()})


MESSAGES_API = ApiPart(
    operations=(
        _operation("/v1/messages", "Anthropic Messages API", MessagesRequest, "Message",
                   streams="events from message_start to message_stop"),
        _operation("/v1/messages/count_tokens", "Tokens of a Messages request's prompt", CountTokensRequest,
                   "MessageTokensCount"),
    ),
    schemas=_answers(),
)
