"""Token logprobs in OpenAI's shape, which chat completions (`logprobs.content`) and the Responses API
(`output_text.logprobs`) share: each entry's token, logprob, UTF-8 bytes and top alternatives."""

from __future__ import annotations

import math
from typing import Any

from conduit.v1 import engine_pb2 as pb

_MIN_LOGPROB = -9999.0  # what OpenAI reports for a probability too small to represent


def logprob_value(value: float) -> float | None:
    """JSON has no NaN or infinity: NaN (no logprob, e.g. the first prompt token) -> null."""
    if math.isnan(value):
        return None
    return max(value, _MIN_LOGPROB)


def token_logprobs(entries: list[pb.TokenLogprob]) -> list[dict[str, Any]]:
    """The engine's logprobs of sampled tokens -> OpenAI's entries, each with its `top_logprobs`."""
    def item(t: pb.TokenLogprob | pb.TopLogprob) -> dict[str, Any]:
        return {"token": t.token, "logprob": logprob_value(t.logprob), "bytes": list(t.bytes or t.token.encode())}

    return [{**item(e), "top_logprobs": [item(t) for t in e.top_logprobs]} for e in entries]
