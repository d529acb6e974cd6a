"""A /v1/responses body, typed: its validation and its part of /openapi.json come from these models.

Items, content parts, tools and tool choices are chosen by their `type` (the base's `by_type`); a type
this server does not serve (image parts, hosted tools' calls, file search...) is refused, named, as
`Unsupported`. Items, parts and tools keep every field they were sent with (`as_sent`), as the store and
the response's echo repeat them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from conduit.v1.contract import MAX_TOP_LOGPROBS

from ..protocol.base import Bool, Count, ModelId, NonEmptyStr, Object, Sent, Str, by_type, fail, got, \
    int_in, one_of, text_or
from ..protocol.chat import ReasoningEffort, ToolName, mode_or, schema_text
from ..protocol.metadata import Metadata
from ..protocol.openapi import ApiPart, Operation, answers, error_responses
from ..protocol.sampling import MaxTokens, SamplingFields, StoppingFields
from ..mcp.protocol import MCP_ITEMS, McpChoice, McpTool
from ..retrieval.protocol import FileSearchTool

# Hosted tools accepted and not offered to the model (request.py's docstring says why).
NOT_OFFERED_TOOLS = ("web_search", "web_search_preview")
TEXT_PARTS = ("input_text", "output_text", "text")
MAX_LIST_LIMIT = 100  # input items listed per page


class Unsupported(Sent):
    """A type this server does not serve (`what`: the kind of thing), refused naming it."""

    what: ClassVar[str]
    type: Any = None

    @model_validator(mode="after")
    def _refuse(self) -> Unsupported:
        raise fail(self.what + " of type {got} are not supported by this server.", field="type",
                   code="unsupported_value", got=got(self.type))


def unsupported(what: str) -> type[Unsupported]:
    return type(f"Unsupported{what.title().replace(' ', '')}", (Unsupported,), {"what": what})


UnsupportedItem, UnsupportedPart = unsupported("Input items"), unsupported("Content parts")
UnsupportedTool, UnsupportedChoice = unsupported("Tools"), unsupported("Tool choices")


def _checked_schema(value: Any) -> Any:
    schema_text(value)
    return value  # as sent: the echo repeats it


JsonSchema = Annotated[Any, PlainValidator(_checked_schema), WithJsonSchema({"type": "object",
                                                                             "description": "a JSON Schema"})]


class TextPart(Sent):
    type: one_of(*TEXT_PARTS)
    text: Str


class RefusalPart(Sent):
    type: one_of("refusal")
    refusal: Str


Content = text_or(by_type({**dict.fromkeys(TEXT_PARTS, TextPart), "refusal": RefusalPart}, UnsupportedPart),
                  items="content parts")


class MessageItem(Sent):
    type: one_of("message") = "message"
    role: one_of("user", "assistant", "system", "developer")
    content: Content


class FunctionCallItem(Sent):
    type: one_of("function_call")
    call_id: Str
    name: NonEmptyStr
    namespace: Str | None = None  # the call of a function in a namespace
    arguments: Str = "{}"


class FunctionCallOutputItem(Sent):
    type: one_of("function_call_output")
    call_id: NonEmptyStr
    output: Content


class FileSearchCallItem(Sent):
    """An earlier response's file search, given back: accepted; its answer (the message after it) carries
    what it found into the prompt."""

    type: one_of("file_search_call")
    queries: list[Str] = []


class ReasoningItem(Sent):
    """An earlier turn's thinking, given back: accepted, left out of the prompt."""

    type: one_of("reasoning")
    summary: list[Any] = []


InputItem = by_type({"message": MessageItem, "function_call": FunctionCallItem,
                     "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
                     "file_search_call": FileSearchCallItem, **MCP_ITEMS},
                    UnsupportedItem, default="message")


class FunctionTool(Sent):
    type: one_of("function")
    name: ToolName
    description: Str | None = None
    parameters: JsonSchema | None = None
    strict: Bool | None = None


class NamespaceTool(Sent):
    """Functions grouped under one name (Codex's sub-agent tools), offered as NAMESPACE__NAME."""

    type: one_of("namespace")
    name: NonEmptyStr
    description: Str | None = None
    tools: Annotated[list[by_type({"function": FunctionTool}, UnsupportedTool)], Field(min_length=1)]


class FileSearch(Sent, FileSearchTool):
    """Run by this server (responses/file_search.py): the model gets a search function, the shim searches."""


class HostedTool(Sent):
    """Web search: accepted, not offered to the model."""

    type: one_of(*NOT_OFFERED_TOOLS)


Tool = by_type({"function": FunctionTool, "namespace": NamespaceTool, "file_search": FileSearch, "mcp": McpTool,
                **dict.fromkeys(NOT_OFFERED_TOOLS, HostedTool)}, UnsupportedTool)


class FunctionChoice(Sent):
    """A named function: forced in `tool_choice`, allowed in `allowed_tools`."""

    type: one_of("function")
    name: Str


class AllowedTools(Sent):
    type: one_of("allowed_tools")
    mode: one_of("auto", "required") = "auto"
    tools: list[by_type({"function": FunctionChoice}, UnsupportedTool)]


class FileSearchChoice(Sent):
    """Forces a file search (the model writes the query)."""

    type: one_of("file_search")


ToolChoice = mode_or(by_type({"function": FunctionChoice, "allowed_tools": AllowedTools,
                              "file_search": FileSearchChoice, "mcp": McpChoice}, UnsupportedChoice),
                     FunctionChoice, AllowedTools, FileSearchChoice, McpChoice)


class TextFormat(Sent):
    type: one_of("text", "json_object", "json_schema")
    name: Str | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")
    strict: Bool | None = None
    description: Str | None = None


class TextOptions(Sent):
    format: TextFormat | None = None


class Reasoning(Sent):
    effort: ReasoningEffort | None = None
    summary: Str | None = None


class ResponseRequest(SamplingFields, StoppingFields):
    """POST /v1/responses. Unknown top-level fields are tolerated (`service_tier`, `prompt_cache_key`,
    Codex's `client_metadata`...)."""

    model: ModelId
    input: text_or(InputItem, items="input items")
    instructions: Str | None = None
    previous_response_id: Str | None = None
    store: Bool | None = None
    stream: Bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: MaxTokens | None = None
    top_logprobs: int_in(0, MAX_TOP_LOGPROBS) | None = None
    include: list[Str] | None = None
    metadata: Metadata | None = None
    truncation: one_of("disabled", "auto") | None = None
    user: Str | None = None
    chat_template_kwargs: Object | None = None  # vendor fields, as the chat route reads them
    max_reasoning_tokens: Count | None = None
    max_tool_calls: int_in(1, 64) | None = None  # hosted tool calls (file search, MCP) run for one response


# ------------------------------------------------------------------ /openapi.json

_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


RESPONSES_API = ApiPart(
    operations=[Operation("/v1/responses", "Create a response (OpenAI Responses API)", ResponseRequest, "Response",
                          streams="its events (event: = data.type)")],
    paths={
        "/v1/responses/{response_id}": {
            "get": {"summary": "A stored (or running) response; stream=true replays its events",
                    "parameters": [_RESPONSE_ID, {"name": "stream", "in": "query", "schema": {"type": "boolean"}}],
                    "responses": answers("Response", error_responses(400, 401, 404), events=True)},
            "delete": {"summary": "Delete a stored response", "parameters": [_RESPONSE_ID],
                       "responses": {"200": {"description": "deleted"}, **error_responses(401, 404)}}},
        "/v1/responses/{response_id}/input_items": {"get": {
            "summary": "The input items a stored response was generated from (inherited ones included)",
            "parameters": [_RESPONSE_ID,
                           {"name": "limit", "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT}},
                           {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                           {"name": "after", "in": "query", "schema": {"type": "string"}}],
            "responses": answers("ResponseInputItems", error_responses(400, 401, 404))}},
        "/v1/responses/{response_id}/cancel": {"post": {
            "summary": "Cancel a response in flight on this server (400 once it finished)",
            "parameters": [_RESPONSE_ID],
            "responses": answers("Response", error_responses(400, 401, 404))}},
    },
    schemas={
        "Response": {"type": "object", "required": ["id", "object", "created_at", "status", "output", "model"],
                     "properties": {
                         "id": {"type": "string"}, "object": {"type": "string", "enum": ["response"]},
                         "created_at": {"type": "integer"}, "model": {"type": "string"},
                         "status": {"type": "string",
                                    "enum": ["completed", "incomplete", "failed", "cancelled", "in_progress"]},
                         "output": {"type": "array", "items": {"type": "object"}},
                         "usage": {"type": "object", "nullable": True}}},
        "ResponseInputItems": {"type": "object", "properties": {
            "object": {"type": "string"}, "data": {"type": "array", "items": {"type": "object"}},
            "has_more": {"type": "boolean"}}},
    },
)
