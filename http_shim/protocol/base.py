"""INTERIM stand-in for openai41's protocol base (replaced by `git merge openai41`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError

from conduit.v1 import engine_pb2 as pb

from ..errors import APIError, invalid


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[StrictInt, BeforeValidator(_integral)]
Number = Annotated[StrictInt | StrictFloat, Field(allow_inf_nan=False)]


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class SamplingFields(ApiModel):
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[Int, Field(ge=-1, le=2**31 - 1)] | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[Number, Field(gt=0, le=2)] | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    seed: Annotated[Int, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    min_tokens: Annotated[Int, Field(ge=0, le=2**32 - 1)] | None = None
    ignore_eos: StrictBool | None = None
    stop_token_ids: list[Annotated[Int, Field(ge=0, le=2**32 - 1)]] | None = None
    logit_bias: dict[str, Number] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_reasoning_tokens: Annotated[Int, Field(ge=0, le=2**32 - 1)] | None = None


def param_path(loc: tuple, skip: frozenset[str] = frozenset()) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier() and part not in ("str", "int", "float", "bool", "dict", "list"):
            out += f".{part}" if out else str(part)
    return out


def parse(model_cls: type[BaseModel], body: Any, *, skip: frozenset[str] = frozenset()) -> Any:
    try:
        return model_cls.model_validate(body)
    except ValidationError as error:
        first = max(error.errors(), key=lambda e: len(e["loc"]))
        param = param_path(first["loc"], skip)
        if first["type"] == "missing":
            raise invalid(f"you must provide a {param} parameter.", param) from None
        if first["msg"].startswith("'"):
            raise invalid(first["msg"], param) from None
        raise APIError(400, f"'{param}': {first['msg']}, got {json.dumps(first.get('input'), default=str)}.",
                       "invalid_request_error", param) from None


def sampling_params(fields: SamplingFields) -> pb.SamplingParams:
    params = pb.SamplingParams(logit_bias={int(k): float(v) for k, v in (fields.logit_bias or {}).items()})
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        if getattr(fields, name) is not None:
            setattr(params, name, getattr(fields, name))
    if fields.top_k is not None:
        params.top_k = max(fields.top_k, 0)
    if fields.seed is not None:
        params.seed = fields.seed % 2**64
    return params


def stopping_params(fields: SamplingFields, max_tokens: int | None) -> pb.StoppingParams:
    stop = [fields.stop] if isinstance(fields.stop, str) else fields.stop or []
    params = pb.StoppingParams(stop=stop, min_tokens=fields.min_tokens or 0, ignore_eos=bool(fields.ignore_eos))
    if max_tokens is not None:
        params.max_tokens = max_tokens
    params.stop_token_ids.extend(fields.stop_token_ids or [])
    return params
