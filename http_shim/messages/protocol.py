"""The Messages API's request bodies as typed models: the one definition both validation (`parse`)
and the /openapi.json document come from. request.py turns a validated body into the engine's request.

Shapes the engine cannot serve are still modelled where their refusal should name them: a content
block of another type (image, document, ...) parses as `OtherBlock` and a tool of another type (a
server tool) as `ServerTool`; request.py refuses each with a 400 that names it and its place.
Unknown fields are ignored at every level (Anthropic adds fields often; see request.py's docstring
for those that are hints).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from conduit.v1.contract import SAMPLING_RANGES

from ._standin import ApiModel, Bool, Int, NonEmptyStr, Number, Str

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
TEMPERATURE_MAX = 1.0  # Anthropic's, narrower than the engine's
TOP_P = SAMPLING_RANGES["top_p"]


class CacheControl(ApiModel):
    """Accepted (the engine's prefix cache serves every request); checked, so a typo is not taken for a mark."""

    type: Literal["ephemeral"]


class TextBlock(ApiModel):
    type: Literal["text"]
    text: Str
    cache_control: CacheControl | None = None


class ToolUseBlock(ApiModel):
    type: Literal["tool_use"]
    id: NonEmptyStr
    name: NonEmptyStr
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ThinkingBlock(ApiModel):
    """An earlier turn's thinking, given back: checked, then dropped. Its signature is required
    (request.py says so in Anthropic's words)."""

    type: Literal["thinking"]
    thinking: Str
    signature: Str | None = None


class RedactedThinkingBlock(ApiModel):
    type: Literal["redacted_thinking"]
    data: Str


class OtherBlock(ApiModel):
    """A block of a type this server does not serve, kept so its refusal can name it."""

    type: Str


def _tagged(by: dict[str, type[ApiModel]], other: type[ApiModel], default: str | None = None) -> Any:
    """A union chosen by the body's `type` (`default` when absent), anything else parsed as `other`."""

    def tag(value: Any) -> str:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        kind = default if kind is None else kind
        return kind if isinstance(kind, str) and kind in by else "other"

    members = [Annotated[cls, Tag(name)] for name, cls in by.items()]
    return Annotated[Union[tuple([*members, Annotated[other, Tag("other")]])], Discriminator(tag)]


class ToolResultBlock(ApiModel):
    type: Literal["tool_result"]
    tool_use_id: NonEmptyStr
    content: Str | list[Block] | None = None  # text blocks only (request.py refuses others, naming them)
    is_error: Bool | None = None
    cache_control: CacheControl | None = None


Block = _tagged({"text": TextBlock, "tool_use": ToolUseBlock, "tool_result": ToolResultBlock,
                 "thinking": ThinkingBlock, "redacted_thinking": RedactedThinkingBlock}, OtherBlock)
Blocks = Annotated[list[Block], Field(min_length=1)]
ToolResultBlock.model_rebuild()


ROLES = ("user", "assistant", "system")


class Message(ApiModel):
    role: Annotated[Str, Field(json_schema_extra={"enum": list(ROLES)})]  # request.py words its refusal
    content: Str | Blocks


class CustomTool(ApiModel):
    type: Literal["custom"] | None = None
    name: Annotated[Str, Field(pattern=TOOL_NAME_PATTERN)]
    description: Str | None = None
    input_schema: dict[str, Any] | Str | bool
    cache_control: CacheControl | None = None
    defer_loading: Bool | None = None  # true: kept out of the prompt until a tool search finds it


class ServerTool(ApiModel):
    """A tool Anthropic runs itself (web search, code execution, ...), kept so its refusal can name it."""

    type: Str


Tool = _tagged({"custom": CustomTool}, ServerTool, default="custom")


class ToolChoice(ApiModel):
    type: Literal["auto", "any", "tool", "none"]
    name: NonEmptyStr | None = None  # for type "tool"
    disable_parallel_tool_use: Bool | None = None


class OutputFormat(ApiModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] | Str | bool = Field(alias="schema")


class OutputConfig(ApiModel):
    format: OutputFormat | None = None
    effort: NonEmptyStr | None = None  # a hint


class Thinking(ApiModel):
    type: Literal["adaptive", "enabled", "disabled"]
    budget_tokens: Annotated[Int, Field(ge=1, le=INT32_MAX)] | None = None  # for "enabled"


class Metadata(ApiModel):
    user_id: Str | None = None


class PromptRequest(ApiModel):
    """What /v1/messages and /v1/messages/count_tokens both render: the prompt and the answer format."""

    model: NonEmptyStr
    messages: Annotated[list[Message], Field(min_length=1)]
    system: Str | Blocks | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's spelling
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None
    mcp_servers: Any = None  # refused when set: this server connects to no MCP server


class MessagesRequest(PromptRequest):
    max_tokens: Annotated[Int, Field(ge=1, le=UINT32_MAX)]
    stop_sequences: list[NonEmptyStr] | None = None
    temperature: Annotated[Number, Field(ge=0.0, le=TEMPERATURE_MAX)] | None = None
    top_p: Annotated[Number, Field(gt=TOP_P.lo, le=TOP_P.hi)] | None = None
    top_k: Annotated[Int, Field(ge=0, le=INT32_MAX)] | None = None
    metadata: Metadata | None = None
    stream: Bool | None = None
