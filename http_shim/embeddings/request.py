"""An /v1/embeddings body -> an EmbedRequest, checked as OpenAI checks it (each error a 400 naming
its `param`). `input`: a string, a list of strings, a list of token ids, or a list of lists of ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import MAX_EMBED_INPUTS

from ..errors import invalid

ENCODING_FORMATS = ("float", "base64")
_UINT32_MAX = 2**32 - 1


@dataclass
class EmbeddingsPlan:
    model: str
    request: pb.EmbedRequest
    encoding_format: str
    one_input: bool  # `input` was one string or one list of ids: errors name "input", not "input[0]"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: list, param: str) -> pb.EmbedInput:
    if not value:
        raise invalid(f"'{param}' must not be an empty list of token ids.", param)
    if not all(_is_int(t) and 0 <= t <= _UINT32_MAX for t in value):
        raise invalid(f"'{param}' must hold token ids: integers from 0 to {_UINT32_MAX}.", param)
    return pb.EmbedInput(token_ids=pb.TokenIds(ids=value))


def _text(value: str, param: str) -> pb.EmbedInput:
    if not value:
        raise invalid(f"'{param}' must not be an empty string.", param)
    return pb.EmbedInput(text=value)


def _inputs(value: Any) -> tuple[list[pb.EmbedInput], bool]:
    """The inputs, and whether `input` was a single one."""
    if isinstance(value, str):
        return [_text(value, "input")], True
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a non-empty string, a non-empty list of strings, a list of token ids or "
                      "a list of lists of token ids.", "input")
    if all(_is_int(t) for t in value):
        return [_token_ids(value, "input")], True
    if len(value) > MAX_EMBED_INPUTS:
        raise invalid(f"'input' holds {len(value)} items; at most {MAX_EMBED_INPUTS} are allowed per request.",
                      "input")
    items = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            items.append(_text(item, f"input[{i}]"))
        elif isinstance(item, list):
            items.append(_token_ids(item, f"input[{i}]"))
        else:
            raise invalid(f"'input[{i}]' must be a string or a list of token ids.", f"input[{i}]")
    return items, False


def parse_embeddings(body: dict, request_id: str) -> EmbeddingsPlan:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: a model id from GET /v1/models.", "model")
    if "input" not in body:
        raise invalid("'input' is required.", "input")
    inputs, one = _inputs(body["input"])
    encoding = body.get("encoding_format")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODING_FORMATS:
        raise invalid(f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}.", "encoding_format")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("'user' must be a string.", "user")
    request = pb.EmbedRequest(model=model, inputs=inputs, request_id=request_id)
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if not _is_int(dimensions) or not 1 <= dimensions <= _UINT32_MAX:
            raise invalid("'dimensions' must be a positive integer.", "dimensions")
        request.dimensions = dimensions
    truncate = body.get("truncate_prompt_tokens")  # vLLM's extension; -1: to the model's context
    if truncate is not None:
        if not _is_int(truncate) or not (truncate == -1 or 1 <= truncate <= _UINT32_MAX):
            raise invalid("'truncate_prompt_tokens' must be -1 (the model's context) or a positive integer.",
                          "truncate_prompt_tokens")
        request.truncate_prompt_tokens = max(truncate, 0)
    return EmbeddingsPlan(model, request, encoding, one)


def openai_param(engine_param: str, one_input: bool) -> str | None:
    """The engine's field path -> the body's: "inputs[2]" -> "input[2]" (or "input" for a single input)."""
    if engine_param.startswith("inputs"):
        return "input" if one_input or engine_param == "inputs" else "input" + engine_param.removeprefix("inputs")
    return engine_param or None
