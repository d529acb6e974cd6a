"""OpenAI's embeddings response: a list of embedding objects and the usage."""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

from .coalesce import EmbedAnswer


def encode_vector(values: Any, encoding_format: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what the openai SDK decodes)."""
    if encoding_format == "float":
        return list(values)
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def embeddings_response(answer: EmbedAnswer, encoding_format: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_vector(e.values, encoding_format)}
                 for i, e in enumerate(answer.embeddings)],
        "model": answer.model,
        "usage": {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens},
    }
