"""The OpenAI API's typed requests (POST /v1/chat/completions and /v1/completions): their validation
and their part of /openapi.json. request.py builds the engine's requests from them.

Accepted and ignored (the openai SDK and frameworks send them; they have no engine meaning):
`user`, `metadata`, `store`, `service_tier`, `modalities`, `audio`, `prediction`,
`web_search_options`, `verbosity`, `prompt_cache_key`, `safety_identifier`,
and any other unknown top-level field. `stream_options` is read only when `stream` is true.

Vendor fields (sent through the SDK's `extra_body`): `top_k` (-1 or 0 = off), `min_p`,
`repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, and `structured_outputs`
({"regex": str} | {"grammar": str} | {"json": schema}) for constraints OpenAI has no field for.

Reasoning models (docs/reasoning.md): `reasoning_effort`, and the vendor fields `chat_template_kwargs`
(an object for the chat template, as vLLM and SGLang take it) and `max_reasoning_tokens` (a thinking
budget the engine enforces).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator
from pydantic.json_schema import SkipJsonSchema

from clients.request_builder import TOOL_CHOICE_MODES
from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import MAX_TOP_LOGPROBS

from ..limits import MAX_COMPLETION_LOGPROBS, MAX_PROMPTS
from ..protocol.base import TOKEN_IDS, UINT32_MAX, ApiModel, Bool, Cap, Count, ModelId, NonEmptyStr, Object, Str, \
    fail, got, ignored, int_in, is_int, one_of, token_ids
from ..protocol.chat import JsonSchemaText, ReasoningEffort, StructuredOutputs, ToolName, mode_or, tool_choice
from ..protocol.openapi import ApiPart, Operation
from ..protocol.sampling import MaxTokens, N, SamplingFields, StoppingFields

ROLES = ("system", "developer", "user", "assistant", "tool")
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}


def _content_text(value: Any) -> str:
    """String content, or an array of text parts joined by newlines (as vLLM does). Text only."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise fail("'{param}' must be a string or a non-empty array of content parts.")
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise fail("'{param}' must be an object.", field=j)
        kind = part.get("type")
        if kind not in ("text", "refusal"):
            raise fail("Content parts of type {kind} are not supported; this model accepts text only.",
                       field=(j, "type"), kind=got(kind))
        if not isinstance(part.get(kind), str):
            raise fail("'{param}' must be a string.", field=(j, kind))
        texts.append(part[kind])
    return "\n".join(texts)


Content = Annotated[str, PlainValidator(_content_text), WithJsonSchema(
    {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "minItems": 1}]})]


def _arguments(value: Any) -> str:
    if isinstance(value, dict):  # some clients send the object itself
        return json.dumps(value)
    if not isinstance(value, str):
        raise fail("'{param}' must be a string.")
    return value


class FunctionCall(ApiModel):
    name: NonEmptyStr
    arguments: Annotated[str, PlainValidator(_arguments), WithJsonSchema({"type": "string"})] = "{}"


class ToolCall(ApiModel):
    id: Str = ""
    type: one_of("function") = "function"
    function: FunctionCall


class ChatMessage(ApiModel):
    """One chat turn; tool_calls are read on assistant turns, tool_call_id on tool turns."""

    role: one_of(*ROLES)
    name: Str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: NonEmptyStr | None = None
    content: Content | None = None

    @model_validator(mode="after")
    def _by_role(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise fail("'{param}' is required for role 'tool'.", field="tool_call_id")
        if self.content is None and self.role != "assistant":
            raise fail("'{param}' is required for role '{role}'.", field="content", role=self.role)
        return self

    def to_pb(self) -> pb.ChatMessage:
        calls = [pb.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                 for c in self.tool_calls or ()] if self.role == "assistant" else []
        return pb.ChatMessage(role=self.role, name=self.name or "", content=self.content or "", tool_calls=calls,
                              tool_call_id=self.tool_call_id if self.role == "tool" else "")


class FunctionDefinition(ApiModel):
    name: ToolName
    description: Str = ""
    parameters: JsonSchemaText | None = None


class ChatTool(ApiModel):
    type: one_of("function")
    function: FunctionDefinition

    def to_pb(self) -> pb.Tool:
        f = self.function
        return pb.Tool(name=f.name, description=f.description, parameters_json=f.parameters or "")


class NamedFunction(ApiModel):
    name: Str


class NamedToolChoice(ApiModel):
    type: one_of("function")
    function: NamedFunction


ToolChoice = Annotated[mode_or(NamedToolChoice), WithJsonSchema({"oneOf": [
    {"type": "string", "enum": list(TOOL_CHOICE_MODES)},
    {"type": "object", "required": ["type", "function"], "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
]})]


class JsonSchemaFormat(ApiModel):
    name: Str | None = None
    schema_: JsonSchemaText | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: Bool | None = None


class ResponseFormat(ApiModel):
    type: one_of("text", "json_object", "json_schema")
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise fail("'{param}' must be an object.", field="json_schema")
        return self

    def constraint(self) -> pb.Constraint | None:
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema.schema_ is None:
            return pb.Constraint(json_object=True)
        return pb.Constraint(json_schema=self.json_schema.schema_)


class StreamOptions(ApiModel):
    include_usage: Bool | None = None


class OpenAIFields(ApiModel):
    """What chat and completions requests share, besides the sampling and stopping fields."""

    model: ModelId
    stream: Bool | None = None
    stream_options: StreamOptions | None = None
    n: N | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    user: ignored({"type": "string"}) = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_when_streaming(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("stream") is not True:
            return {k: v for k, v in value.items() if k != "stream_options"}
        return value

    @model_validator(mode="after")
    def _one_constraint(self) -> OpenAIFields:
        if self.response_format is not None and self.structured_outputs is not None:
            raise fail("Use either 'response_format' or 'structured_outputs', not both.", field="structured_outputs")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def constraint(self) -> pb.Constraint | None:
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint()
        return None if self.response_format is None else self.response_format.constraint()


def _deprecated(value: Any) -> None:
    raise fail("'{param}' is deprecated and not supported; use 'tools' and 'tool_choice'.")


Deprecated = SkipJsonSchema[Annotated[Any, PlainValidator(_deprecated)]]


CompletionMaxTokens = Annotated[int_in(0, UINT32_MAX), Cap("max_tokens")]  # from 0 (chat's MaxTokens: from 1)


class ChatCompletionRequest(SamplingFields, StoppingFields, OpenAIFields):
    functions: Deprecated = None
    function_call: Deprecated = None
    messages: Annotated[list[ChatMessage], Field(min_length=1), Cap("max_messages", "maxItems", "messages")]
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: Bool | None = None
    top_logprobs: int_in(0, MAX_TOP_LOGPROBS) | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: Object | None = None
    max_reasoning_tokens: Count | None = None
    metadata: ignored({"type": "object"}) = None
    store: ignored({"type": "boolean"}) = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise fail("'{param}' must be true when 'top_logprobs' is set.", field="logprobs")
        return self

    def tool_choice_pb(self, tools: list[pb.Tool]) -> pb.ToolChoice:
        named = self.tool_choice if isinstance(self.tool_choice, NamedToolChoice) else None
        return tool_choice(None if named else self.tool_choice, named and named.function.name, tools)


def _prompts(value: Any) -> list[str | list[int]]:
    """A string, strings, token ids, or lists of token ids -> one entry per prompt."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise fail("'{param}' must be an array.")
    if not value:
        raise fail("'{param}' must not be empty.")
    if all(isinstance(p, str) for p in value):
        prompts: list[str | list[int]] = list(value)
    elif all(is_int(p) for p in value):
        prompts = [token_ids(value)]
    elif all(isinstance(p, list) for p in value):
        prompts = [token_ids(p, i) for i, p in enumerate(value)]
    else:
        raise fail("'{param}' must be a string, an array of strings, an array of token ids or an array of "
                   "token-id arrays.")
    if len(prompts) > MAX_PROMPTS:
        raise fail("'{param}' may hold at most {most} prompts, got {got}.", most=MAX_PROMPTS, got=len(prompts))
    return prompts


Prompt = Annotated[list, PlainValidator(_prompts), WithJsonSchema({"oneOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_PROMPTS},
    TOKEN_IDS,
    {"type": "array", "items": TOKEN_IDS, "minItems": 1, "maxItems": MAX_PROMPTS},
]})]


def _suffix(value: Any) -> str:
    if not isinstance(value, str):
        raise fail("'{param}' must be a string.")
    if value:
        raise fail("'{param}' is not supported: the model has no fill-in-the-middle support.")
    return value


class CompletionRequest(SamplingFields, StoppingFields, OpenAIFields):
    prompt: Prompt
    suffix: Annotated[str, PlainValidator(_suffix), WithJsonSchema(
        {"type": "string", "maxLength": 0, "description": "not supported unless empty"})] | None = None
    best_of: N | None = None
    logprobs: int_in(0, MAX_COMPLETION_LOGPROBS) | None = None
    echo: Bool | None = None
    max_tokens: CompletionMaxTokens | None = None

    @model_validator(mode="after")
    def _best_of(self) -> CompletionRequest:
        n, best_of = self.n or 1, self.best_of
        if best_of is not None and best_of < n:
            raise fail("'{param}' ({best_of}) must be greater than or equal to 'n' ({n}).", field="best_of",
                       best_of=best_of, n=n)
        if self.stream and best_of is not None and best_of > n:
            raise fail("'{param}' greater than 'n' cannot be used with 'stream'.", field="best_of")
        return self


def _answer(kind: str) -> dict[str, Any]:
    counts = {n: {"type": "integer"} for n in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage = {"type": "object", "properties": {**counts, "prompt_tokens_details": {
        "type": "object", "properties": {"cached_tokens": {"type": "integer"}},
        "description": "cached_tokens: prompt tokens served from the engine's prefix cache"}}}
    return {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
        "id": {"type": "string"}, "object": {"type": "string", "enum": [kind]}, "created": {"type": "integer"},
        "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}}, "usage": usage}}


_SSE = "server-sent events ending with data: [DONE]"
OPENAI_API = ApiPart(
    operations=[
        Operation("/v1/chat/completions", "Chat completion", ChatCompletionRequest, "ChatCompletion", _SSE),
        Operation("/v1/completions", "Text completion", CompletionRequest, "Completion", _SSE),
    ],
    schemas={"ChatCompletion": _answer("chat.completion"), "Completion": _answer("text_completion")},
)
