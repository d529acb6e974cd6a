"""INTERIM: openai41's shared sampling fields (http_shim/protocol/sampling.py), until that lands."""

from __future__ import annotations

from typing import Annotated, Any

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import SAMPLING_RANGES

from ..protocol.base import ApiModel, Bool, Cap, Count, Object, Str, TokenId, Whole, int_in, number_in


class SamplingFields(ApiModel):
    temperature: number_in(SAMPLING_RANGES["temperature"]) | None = None
    top_p: number_in(SAMPLING_RANGES["top_p"]) | None = None
    min_p: number_in(SAMPLING_RANGES["min_p"]) | None = None
    repetition_penalty: number_in(SAMPLING_RANGES["repetition_penalty"]) | None = None
    presence_penalty: number_in(SAMPLING_RANGES["presence_penalty"]) | None = None
    frequency_penalty: number_in(SAMPLING_RANGES["frequency_penalty"]) | None = None
    top_k: int_in(-1, 2**31 - 1) | None = None
    seed: int_in(-(2**63), 2**64 - 1) | None = None
    logit_bias: Object | None = None


class StoppingFields(ApiModel):
    stop: Annotated[Str | list[Str], Cap("max_stop", "maxItems", "strings")] | None = None
    min_tokens: Count | None = None
    ignore_eos: Bool | None = None
    stop_token_ids: Annotated[list[TokenId], Whole()] | None = None


def sampling_params(fields: Any) -> pb.SamplingParams:
    params = pb.SamplingParams(logit_bias={int(k): float(v) for k, v in (fields.logit_bias or {}).items()})
    for name in SAMPLING_RANGES:
        if getattr(fields, name) is not None:
            setattr(params, name, getattr(fields, name))
    if fields.top_k is not None:
        params.top_k = max(fields.top_k, 0)
    if fields.seed is not None:
        params.seed = fields.seed % 2**64
    return params


def stopping_params(fields: Any, max_tokens: int | None) -> pb.StoppingParams:
    stop = [fields.stop] if isinstance(fields.stop, str) else fields.stop or []
    params = pb.StoppingParams(stop=stop, min_tokens=fields.min_tokens or 0, ignore_eos=bool(fields.ignore_eos))
    if max_tokens is not None:
        params.max_tokens = max_tokens
    params.stop_token_ids.extend(fields.stop_token_ids or [])
    return params
