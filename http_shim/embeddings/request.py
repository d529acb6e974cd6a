"""An /v1/embeddings body -> an EmbedRequest, checked as OpenAI checks it (protocol.py: each error a
400 naming its `param`), and the engine's field paths back to the body's names."""

from __future__ import annotations

from dataclasses import dataclass

from conduit.v1 import engine_pb2 as pb

from ..protocol.base import parse
from .protocol import EmbeddingRequest


@dataclass
class EmbeddingsPlan:
    model: str
    request: pb.EmbedRequest
    encoding_format: str
    one_input: bool  # `input` was one string or one list of ids: errors name "input", not "input[0]"


def parse_embeddings(body: dict, request_id: str) -> EmbeddingsPlan:
    checked = parse(EmbeddingRequest, body)
    inputs, one = checked.input
    request = pb.EmbedRequest(model=checked.model, inputs=inputs, request_id=request_id)
    if checked.dimensions is not None:
        request.dimensions = checked.dimensions
    if checked.truncate_prompt_tokens is not None:
        request.truncate_prompt_tokens = max(checked.truncate_prompt_tokens, 0)  # -1: to the model's context
    return EmbeddingsPlan(checked.model, request, checked.encoding_format, one)


def openai_param(engine_param: str, one_input: bool) -> str | None:
    """The engine's field path -> the body's: "inputs[2]" -> "input[2]" (or "input" for a single input)."""
    if engine_param.startswith("inputs"):
        return "input" if one_input or engine_param == "inputs" else "input" + engine_param.removeprefix("inputs")
    return engine_param or None
