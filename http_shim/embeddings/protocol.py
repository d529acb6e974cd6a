"""The typed requests of POST /v1/embeddings (OpenAI's shape, and the EmbedRequest it becomes), /tokenize
and /detokenize (vLLM's): their validation and their part of /openapi.json."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import MAX_EMBED_INPUTS

from ..openai.protocol import ChatMessage
from ..protocol.base import (TOKEN_IDS, UINT32_MAX, ApiModel, Bool, ModelId, Str, TokenId, Whole, fail, int_in, is_int,
                              one_of, token_ids)
from ..protocol.openapi import ApiPart, Operation

ENCODING_FORMATS = ("float", "base64")


def _token_ids(value: list, index: int | None) -> pb.EmbedInput:
    return pb.EmbedInput(token_ids=pb.TokenIds(ids=token_ids(value, index)))


def _text(value: str, index: int | None) -> pb.EmbedInput:
    if not value:
        raise fail("'{param}' must not be an empty string.", field=index)
    return pb.EmbedInput(text=value)


def _inputs(value: Any) -> tuple[list[pb.EmbedInput], bool]:
    """The inputs, and whether `input` was a single one."""
    if isinstance(value, str):
        return [_text(value, None)], True
    if not isinstance(value, list) or not value:
        raise fail("'{param}' must be a non-empty string, a non-empty list of strings, a list of token ids or "
                   "a list of lists of token ids.")
    if all(is_int(t) for t in value):
        return [_token_ids(value, None)], True
    if len(value) > MAX_EMBED_INPUTS:
        raise fail("'{param}' holds {got} items; at most {most} are allowed per request.", got=len(value),
                   most=MAX_EMBED_INPUTS)
    items = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            items.append(_text(item, i))
        elif isinstance(item, list):
            items.append(_token_ids(item, i))
        else:
            raise fail("'{param}' must be a string or a list of token ids.", field=i)
    return items, False


EmbeddingInput = Annotated[tuple, PlainValidator(_inputs), WithJsonSchema({"oneOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS, "items": {"type": "string", "minLength": 1}},
    TOKEN_IDS,
    {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS, "items": TOKEN_IDS},
], "description": "text, or the model's own token ids (as POST /tokenize returns them)"})]


def _truncate(value: Any) -> int:
    if not is_int(value) or not (value == -1 or 1 <= value <= UINT32_MAX):
        raise fail("'{param}' must be -1 (the model's context) or a positive integer.")
    return value


class EmbeddingRequest(ApiModel):
    model: ModelId
    input: EmbeddingInput  # (the inputs, whether `input` was one: errors then name "input", not "input[0]")
    encoding_format: one_of(*ENCODING_FORMATS) = Field("float", description="base64: little-endian float32")
    dimensions: int_in(1, UINT32_MAX) | None = Field(
        None, description="only for models trained for shorter vectors; else their own size")
    user: Str | None = None
    truncate_prompt_tokens: Annotated[int, PlainValidator(_truncate), WithJsonSchema(  # vLLM's extension
        {"type": "integer", "minimum": -1, "maximum": UINT32_MAX,
         "description": "cut longer inputs to this many tokens (-1: the context)"})] | None = None

    def to_pb(self, request_id: str) -> pb.EmbedRequest:
        truncate = self.truncate_prompt_tokens  # -1 (the model's context) is the field's 0
        return pb.EmbedRequest(model=self.model, inputs=self.input[0], request_id=request_id,
                               dimensions=self.dimensions,
                               truncate_prompt_tokens=None if truncate is None else max(truncate, 0))


class TokenizeRequest(ApiModel):
    """Either prompt or messages."""

    model: ModelId
    prompt: Str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    return_token_strs: Bool | None = None

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise fail("Give either 'prompt' (a string) or 'messages' (a non-empty list).", field="prompt")
        return self


class DetokenizeRequest(ApiModel):
    model: ModelId
    tokens: Annotated[list[TokenId], Whole()]


EMBEDDINGS_API = ApiPart(
    operations=[
        Operation("/v1/embeddings", "Embeddings (an embedding model's)", EmbeddingRequest, "EmbeddingList"),
        Operation("/tokenize", "Token ids of a prompt or chat (vLLM's shape)", TokenizeRequest, "TokenizeResponse"),
        Operation("/detokenize", "Text of token ids (vLLM's shape)", DetokenizeRequest, "DetokenizeResponse"),
    ],
    schemas={
        "EmbeddingList": {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"],
                                                "properties": {
                "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"},
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
            "model": {"type": "string"},
            "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                       "total_tokens": {"type": "integer"}}}}},
        "TokenizeResponse": {"type": "object", "properties": {
            "count": {"type": "integer"}, "max_model_len": {"type": "integer"},
            "tokens": {"type": "array", "items": {"type": "integer"}},
            "token_strs": {"type": "array", "items": {"type": "string"}}}},
        "DetokenizeResponse": {"type": "object", "properties": {"prompt": {"type": "string"}}},
    },
)
