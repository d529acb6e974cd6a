"""A /v1/responses body, typed: validation and the request's part of /openapi.json come from these models.

Union members marked `Unsupported` catch the types this server does not serve (image parts, hosted tools'
calls, file search...): they validate anything, stay out of the schema, and request.py refuses them by
name. Items, parts and tools keep the fields they were sent with, as the store and the echo repeat them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, ConfigDict, Discriminator, Field, StrictBool, StrictStr, Tag
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from conduit.v1.contract import MAX_TOP_LOGPROBS, REASONING_EFFORTS

from ..protocol.base import ApiModel, Int, SamplingFields  # noqa: F401  (filled in by the base)

Str, Bool = StrictStr, StrictBool
UINT32_MAX = 2**32 - 1
# Hosted tools accepted and not offered to the model (request.py's docstring says why).
NOT_OFFERED_TOOLS = ("web_search", "web_search_preview")
TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = ("user", "assistant", "system", "developer")
METADATA_MAX_KEYS, METADATA_MAX_KEY_CHARS, METADATA_MAX_VALUE_CHARS = 16, 64, 512  # OpenAI's limits


class Sent(ApiModel):
    """A part of the request kept as sent (stored, echoed): fields this server does not read stay."""

    model_config = ConfigDict(extra="allow")

    def as_sent(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Unsupported(Sent):
    """A member of a union of a type this server does not serve; refused by name (request.py)."""

    type: Any = None


def tagged(*members: tuple[str, type], default: str | None = None) -> Any:
    """A union chosen by `type` (`default` when absent); other types are Unsupported."""
    known = {tag for tag, _ in members}

    def kind(value: Any) -> str:
        tag = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return f"type={tag if tag in known else 'unsupported'}"

    alternatives = [Annotated[model, Tag(f"type={tag}")] for tag, model in members]
    return Annotated[Union[(*alternatives, Annotated[SkipJsonSchema[Unsupported], Tag("type=unsupported")])],
                     Discriminator(kind)]


# ------------------------------------------------------------------ input items


class TextPart(Sent):
    type: Literal["input_text", "output_text", "text"]
    text: Str


class RefusalPart(Sent):
    type: Literal["refusal"]
    refusal: Str


Part = tagged(*((kind, TextPart) for kind in TEXT_PARTS), ("refusal", RefusalPart))
Content = Union[Str, list[Part]]


class MessageItem(Sent):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: Str | None = None


class FunctionCallItem(Sent):
    type: Literal["function_call"]
    call_id: Annotated[Str, Field(min_length=1)]
    name: Annotated[Str, Field(min_length=1)]
    namespace: Str | None = None
    arguments: Str = "{}"
    id: Str | None = None


class FunctionCallOutputItem(Sent):
    type: Literal["function_call_output"]
    call_id: Annotated[Str, Field(min_length=1)]
    output: Content
    id: Str | None = None


class ReasoningItem(Sent):
    """An earlier turn's thinking, given back: accepted, not part of the prompt."""

    type: Literal["reasoning"]
    summary: list[Any] = []
    id: Str | None = None


InputItem = tagged(("message", MessageItem), ("function_call", FunctionCallItem),
                   ("function_call_output", FunctionCallOutputItem), ("reasoning", ReasoningItem), default="message")


# ------------------------------------------------------------------ tools, tool choice, format


class FunctionTool(Sent):
    type: Literal["function"]
    name: Str
    description: Str | None = None
    parameters: Any = None
    strict: Bool | None = None


class NamespaceTool(Sent):
    """Functions grouped under one name (Codex's sub-agent tools): offered as NAMESPACE__NAME."""

    type: Literal["namespace"]
    name: Annotated[Str, Field(min_length=1)]
    description: Str | None = None
    tools: Annotated[list[tagged(("function", FunctionTool))], Field(min_length=1)]


class HostedTool(Sent):
    """A hosted tool accepted and not offered to the model (web search)."""

    type: Literal["web_search", "web_search_preview"]


Tool = tagged(("function", FunctionTool), ("namespace", NamespaceTool), *((t, HostedTool) for t in NOT_OFFERED_TOOLS))


class FunctionChoice(Sent):
    type: Literal["function"]
    name: Str


class AllowedFunction(Sent):
    type: Literal["function"]
    name: Str


class AllowedTools(Sent):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"] = "auto"
    tools: list[tagged(("function", AllowedFunction))]


ToolChoice = Union[Str, tagged(("function", FunctionChoice), ("allowed_tools", AllowedTools))]


class TextFormat(Sent):
    type: Literal["text", "json_object", "json_schema"]
    name: Str | None = None
    schema_: Any = Field(None, alias="schema")
    strict: Bool | None = None
    description: Str | None = None


class TextOptions(Sent):
    format: TextFormat | None = None


class Reasoning(Sent):
    effort: Literal[REASONING_EFFORTS] | None = None
    summary: Str | None = None


# ------------------------------------------------------------------ the request


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's bounds, each refused naming `metadata` itself."""
    if len(value) > METADATA_MAX_KEYS:
        raise PydanticCustomError("metadata", f"'metadata' may hold at most {METADATA_MAX_KEYS} keys, got {len(value)}.")
    if any(len(key) > METADATA_MAX_KEY_CHARS for key in value):
        raise PydanticCustomError("metadata", f"'metadata' keys may be at most {METADATA_MAX_KEY_CHARS} characters.")
    if not all(isinstance(v, str) and len(v) <= METADATA_MAX_VALUE_CHARS for v in value.values()):
        raise PydanticCustomError(
            "metadata", f"'metadata' values must be strings of at most {METADATA_MAX_VALUE_CHARS} characters.")
    return value


class ResponseRequest(SamplingFields):
    """POST /v1/responses. Unknown top-level fields are tolerated (`service_tier`, `prompt_cache_key`,
    Codex's `client_metadata`...), as the chat route tolerates them."""

    model: Annotated[Str, Field(min_length=1)]
    input: Union[Str, list[InputItem]]
    instructions: Str | None = None
    previous_response_id: Str | None = None
    store: Bool | None = None
    stream: Bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: Annotated[Int, Field(ge=1, le=UINT32_MAX)] | None = None
    top_logprobs: Annotated[Int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    include: list[Str] | None = None
    metadata: Annotated[dict[Str, Any], AfterValidator(_metadata)] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    user: Str | None = None
