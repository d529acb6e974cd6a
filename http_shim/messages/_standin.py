"""TEMPORARY stand-in for http_shim/protocol/base.py until openai41's base lands (then deleted)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from pydantic_core import PydanticCustomError

from ..errors import invalid


def _int(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("int_type", "'{param}' must be an integer, got {got}.", {"got": json.dumps(value)})
    return value


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PydanticCustomError("float_type", "'{param}' must be a number, got {got}.", {"got": json.dumps(value)})
    return float(value)


Int = Annotated[int, BeforeValidator(_int)]
Number = Annotated[float, BeforeValidator(_number)]
Str = StrictStr
Bool = StrictBool
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


M = TypeVar("M", bound=BaseModel)


def param_of(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
    return out


def parse(model_cls: type[M], body: Any) -> M:
    try:
        return model_cls.model_validate(body)
    except ValidationError as failed:
        error = max(failed.errors(), key=lambda e: len(e["loc"]))
        param = param_of(error["loc"])
        message = error["msg"].replace("{param}", param)
        if error["type"] == "missing":
            message = f"'{param}' is required."
        elif error["type"] == "literal_error":
            message = f"'{param}' must be {error['ctx']['expected']}, got {json.dumps(error['input'])}."
        elif "{" not in error["msg"] and not message.startswith("'"):
            message = f"'{param}': {message}."
        raise invalid(message, param) from None
