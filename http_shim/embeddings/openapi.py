"""The embeddings part of /openapi.json (POST /v1/embeddings, /tokenize, /detokenize), merged in by
http_shim/openapi.py, with the limits request.py enforces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conduit.v1.contract import MAX_EMBED_INPUTS

from .request import ENCODING_FORMATS

Schema = dict[str, Any]
_UINT32_MAX = 2**32 - 1


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _schemas() -> dict[str, Schema]:
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}}
    model = {"type": "string", "minLength": 1, "description": "a model id from GET /v1/models"}
    return {
        "EmbeddingRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": model,
                "input": {"oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS,
                     "items": {"type": "string", "minLength": 1}},
                    token_ids,
                    {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS, "items": token_ids},
                ], "description": "text, or the model's own token ids (as POST /tokenize returns them)"},
                "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS), "nullable": True,
                                    "description": "base64: little-endian float32"},
                "dimensions": {"type": "integer", "minimum": 1, "maximum": _UINT32_MAX, "nullable": True,
                               "description": "only for models trained for shorter vectors; else their own size"},
                "user": {"type": "string"},
                "truncate_prompt_tokens": {"type": "integer", "minimum": -1, "maximum": _UINT32_MAX, "nullable": True,
                                           "description": "cut longer inputs to this many tokens (-1: the context)"},
            },
        },
        "EmbeddingList": {
            "type": "object",
            "required": ["object", "data", "model", "usage"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"],
                                                    "properties": {
                    "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"},
                    "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
                "model": {"type": "string"},
                "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                           "total_tokens": {"type": "integer"}}},
            },
        },
        "TokenizeRequest": {
            "type": "object",
            "required": ["model"],
            "properties": {"model": model, "prompt": {"type": "string"},
                           "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
                           "return_token_strs": {"type": "boolean"}},
            "description": "either prompt or messages",
        },
        "TokenizeResponse": {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "max_model_len": {"type": "integer"},
                           "tokens": {"type": "array", "items": {"type": "integer"}},
                           "token_strs": {"type": "array", "items": {"type": "string"}}},
        },
        "DetokenizeRequest": {
            "type": "object",
            "required": ["model", "tokens"],
            "properties": {"model": model,
                           "tokens": {"type": "array",
                                      "items": {"type": "integer", "minimum": 0, "maximum": _UINT32_MAX}}},
        },
        "DetokenizeResponse": {"type": "object", "properties": {"prompt": {"type": "string"}}},
    }


def embeddings_openapi(headers: list[Schema], errors: Callable[..., dict[str, Any]]) -> tuple[dict, dict]:
    """(paths, schemas); `errors(*statuses)` gives the error responses as the rest of the document does."""

    def post(summary: str, request: str, response: str) -> dict[str, Any]:
        return {"post": {
            "summary": summary,
            "parameters": headers,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": {"description": "the answer",
                                  "content": {"application/json": {"schema": _ref(response)}}},
                          **errors(400, 401, 404, 413, 429, 500, 502, 503, 504)},
        }}

    paths = {
        "/v1/embeddings": post("Embeddings (an embedding model's)", "EmbeddingRequest", "EmbeddingList"),
        "/tokenize": post("Token ids of a prompt or chat (vLLM's shape)", "TokenizeRequest", "TokenizeResponse"),
        "/detokenize": post("Text of token ids (vLLM's shape)", "DetokenizeRequest", "DetokenizeResponse"),
    }
    return paths, _schemas()
