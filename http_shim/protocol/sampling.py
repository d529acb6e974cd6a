"""The sampling and stopping fields every generation API shares (OpenAI's names, vLLM's vendor fields),
with the engine's ranges, and their builders. The builders read attributes by name, so an API whose model
names a subset of these fields (or spells `stop` otherwise, passed as `stop=`) uses them too.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema

from conduit.v1 import engine_pb2 as pb
from conduit.v1.contract import LOGIT_BIAS_RANGE, SAMPLING_RANGES

from .base import UINT32_MAX, ApiModel, Bool, Cap, Count, TokenId, Whole, fail, got, int_in, is_number, \
    number_in

TopK = int_in(-1, 2**31 - 1)  # -1 or 0: off (vLLM spells it -1)
Seed = int_in(-(2**63), 2**64 - 1)  # OpenAI's are signed; the engine's unsigned (see sampling_params)
N = Annotated[int_in(1, UINT32_MAX), Cap("max_n")]  # choices per prompt, within the operator's cap
MaxTokens = Annotated[int_in(1, UINT32_MAX), Cap("max_tokens")]  # tokens to generate, within the operator's cap


def _logit_bias(value: Any) -> dict[int, float]:
    if not isinstance(value, dict):
        raise fail("'{param}' must be an object.")
    bias: dict[int, float] = {}
    for key, weight in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) <= UINT32_MAX):
            raise fail("'{param}' keys must be token ids as strings, got {got}.", got=got(key))
        if not is_number(weight) or weight not in LOGIT_BIAS_RANGE:
            raise fail("'{param}' values must be numbers in {range}, got {got}.", range=LOGIT_BIAS_RANGE,
                       got=got(weight))
        bias[int(key)] = float(weight)
    return bias


LogitBias = Annotated[dict[int, float], PlainValidator(_logit_bias), WithJsonSchema({
    "type": "object",
    "description": "token id (as a string) -> bias",
    "additionalProperties": {"type": "number", "minimum": LOGIT_BIAS_RANGE.lo, "maximum": LOGIT_BIAS_RANGE.hi},
    "propertyNames": {"pattern": "^[0-9]{1,10}$"},
})]


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise fail("'{param}' must be a string or an array of strings.")
    for stop in stops:
        if not isinstance(stop, str) or not stop:
            raise fail("'{param}' must hold non-empty strings.")
    return stops


_STOP_STRING = {"type": "string", "minLength": 1}
Stop = Annotated[list[str], PlainValidator(_stop),
                 WithJsonSchema({"oneOf": [_STOP_STRING, {"type": "array", "items": _STOP_STRING}]}),
                 Cap("max_stop", "maxItems", "strings")]


class SamplingFields(ApiModel):
    """SamplingParams' fields; top_k, min_p and repetition_penalty are vendor fields (vLLM's)."""

    temperature: number_in(SAMPLING_RANGES["temperature"]) | None = None
    top_p: number_in(SAMPLING_RANGES["top_p"]) | None = None
    min_p: number_in(SAMPLING_RANGES["min_p"]) | None = None
    repetition_penalty: number_in(SAMPLING_RANGES["repetition_penalty"]) | None = None
    presence_penalty: number_in(SAMPLING_RANGES["presence_penalty"]) | None = None
    frequency_penalty: number_in(SAMPLING_RANGES["frequency_penalty"]) | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    logit_bias: LogitBias | None = None


class StoppingFields(ApiModel):
    """StoppingParams' fields but max_tokens (each API names and bounds its own); min_tokens, ignore_eos
    and stop_token_ids are vendor fields (vLLM's)."""

    stop: Stop | None = None
    min_tokens: Count | None = None
    ignore_eos: Bool | None = None
    stop_token_ids: Annotated[list[TokenId], Whole()] | None = None


# Both builders pass None for a field left out: a message's constructor leaves such a field unset.
def sampling_params(fields: Any) -> pb.SamplingParams:
    """SamplingParams from whichever of SamplingFields' attributes `fields` has (None: the engine's default)."""
    top_k, seed = getattr(fields, "top_k", None), getattr(fields, "seed", None)
    return pb.SamplingParams(
        logit_bias=getattr(fields, "logit_bias", None) or {},
        top_k=None if top_k is None else max(top_k, 0),
        seed=None if seed is None else seed % 2**64,  # negative OpenAI seeds wrap, deterministically
        **{name: getattr(fields, name, None) for name in SAMPLING_RANGES})


def stopping_params(fields: Any, max_tokens: int | None, stop: list[str] | None = None) -> pb.StoppingParams:
    """StoppingParams from StoppingFields' attributes; `stop` overrides `fields.stop` (another API's name)."""
    return pb.StoppingParams(
        stop=stop if stop is not None else getattr(fields, "stop", None) or [],
        max_tokens=max_tokens,
        min_tokens=getattr(fields, "min_tokens", None) or 0,
        ignore_eos=bool(getattr(fields, "ignore_eos", None)),
        stop_token_ids=getattr(fields, "stop_token_ids", None) or [])
