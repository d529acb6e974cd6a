"""The base of every API's typed requests (see the package docstring): `ApiModel`, the strict scalar
types, operator caps (`Cap`), and `parse`. pydantic's own failures get their words from `_PYDANTIC_MESSAGES`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, PlainValidator, \
    Strict, StrictBool, StrictStr, StringConstraints, TypeAdapter, ValidationError, ValidationInfo, WithJsonSchema, \
    model_validator
from pydantic_core import PydanticCustomError, core_schema

from conduit.v1.contract import Range

from ..errors import invalid
from ..limits import DEFAULT_LIMITS, UINT32_MAX, RequestLimits

Schema = dict[str, Any]
M = TypeVar("M", bound=BaseModel)
_CONDUIT = "conduit"  # the pydantic error type of the failures raised by `fail`


def fail(template: str, field: str | int | tuple[str | int, ...] | None = None, code: str | None = None,
         **values: Any) -> PydanticCustomError:
    """A validation failure; `template` may use `param` ("messages[0].role"), `path` (pydantic's and
    Anthropic's spelling: "messages.0.role") and `values`. `field`: a field (or a path, as a tuple)
    below the failing value, for checks across an object's fields. `code`: the error's `code`, if any."""
    return PydanticCustomError(_CONDUIT, template, {"template": template, "field": field, "code": code, **values})


def got(value: Any) -> str:
    """A value as a message shows it: as JSON, or its type's name where JSON has no spelling."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return type(value).__name__


class ApiModel(BaseModel):
    """A request object: unknown fields are tolerated and dropped (OpenAI's clients send many), and a
    field set to null is the field left out, as every API the shim speaks treats it."""

    model_config = ConfigDict(extra="ignore", frozen=True, regex_engine="python-re")  # Python's `$`, as TOOL_NAME

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, value: Any) -> Any:
        if isinstance(value, dict) and None in value.values():  # (pydantic refuses a value not an object)
            return {k: v for k, v in value.items() if v is not None}
        return value


def _scalar(check: Any, schema: Schema) -> Any:
    return (PlainValidator(check), WithJsonSchema(schema))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _as_int(value: Any) -> int:
    """2.0 is 2 (JSON has one number type); bools and strings are refused."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise fail("'{param}' must be an integer, got {got}.", got=got(value))
    return value


def int_in(lo: int, hi: int) -> Any:
    """An integer in [lo, hi]."""

    def check(value: Any) -> int:
        value = _as_int(value)
        if not lo <= value <= hi:
            raise fail("'{param}' must be between {lo} and {hi}, got {got}.", lo=lo, hi=hi, got=value)
        return value

    return Annotated[int, *_scalar(check, {"type": "integer", "minimum": lo, "maximum": hi})]


def number_in(allowed: Range) -> Any:
    """A finite number in `allowed`, as a float."""

    def check(value: Any) -> float:
        if not is_number(value):
            raise fail("'{param}' must be a number, got {got}.", got=got(value))
        if value not in allowed:
            low = f"greater than {allowed.lo}" if allowed.lo_open else f"at least {allowed.lo}"
            raise fail("'{param}' must be {low} and at most {hi}, got {got}.", low=low, hi=allowed.hi, got=value)
        return float(value)

    schema: Schema = {"type": "number", "minimum": allowed.lo, "maximum": allowed.hi}
    if allowed.lo_open:
        schema["exclusiveMinimum"] = True
    return Annotated[float, *_scalar(check, schema)]


def _token_id(value: Any, field: int | None = None) -> int:
    if not is_int(value) or not 0 <= value <= UINT32_MAX:
        raise fail("'{param}' must be a non-negative integer token id, got {got}.", field=field, got=got(value))
    return value


def token_ids(ids: list, field: int | None = None) -> list[int]:
    """A prompt as token ids: a non-empty list (at `field` below the value checked, when given)."""
    if not ids:
        raise fail("'{param}' must not be empty.", field=field)
    for t in ids:
        _token_id(t, field)
    return ids


class Sent(ApiModel):
    """A part of the request kept as sent (stored, echoed): fields this server does not read stay."""

    model_config = ConfigDict(extra="allow")

    def as_sent(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def one_of(*values: str, wording: str = "'{param}' must be one of {values}; got {got}.") -> Any:
    """A string among `values` (an enum in the document). `wording` names them as {values} ("a, b, c") or
    as {words} ("'a', 'b' or 'c'", the Messages API's spelling)."""
    quoted = [f"'{v}'" for v in values]
    words = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(values) > 1 else quoted[0]

    def check(value: Any) -> str:
        if value not in values:
            raise fail(wording, values=", ".join(values), words=words, got=got(value))
        return value

    return Annotated[str, *_scalar(check, {"type": "string", "enum": list(values)})]


Str = StrictStr
NonEmptyStr = Annotated[str, StringConstraints(strict=True, min_length=1)]
Bool = StrictBool
Object = Annotated[dict, Strict(), WithJsonSchema({"type": "object"})]  # any JSON object
TokenId = Annotated[int, *_scalar(_token_id, {"type": "integer", "minimum": 0, "maximum": UINT32_MAX})]
TOKEN_IDS: Schema = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}}
Count = int_in(0, UINT32_MAX)  # a token count: min_tokens, budgets
ModelId = Annotated[NonEmptyStr, Field(description="a model id from GET /v1/models")]


@dataclass(frozen=True)
class Cap:
    """An operator's limit on a field (RequestLimits.<limit>): checked against the limits `parse` was
    given, and written into the document as `keyword` (maximum, maxItems) by the generator (the schema
    carries {"x-cap": [limit, keyword]} until then). `noun`: what a list holds, for the message."""

    limit: str
    keyword: str = "maximum"
    noun: str = ""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> Schema:
        document = handler(schema)
        arrays = [m for m in document.get("oneOf", ()) if m.get("type") == "array"]
        (arrays[0] if arrays else document)["x-cap"] = [self.limit, self.keyword]  # a string or strings: the array
        return document

    def _check(self, value: Any, info: ValidationInfo) -> Any:
        cap = getattr((info.context or {}).get("limits", DEFAULT_LIMITS), self.limit)
        size = len(value) if self.noun else value
        if cap is not None and size > cap:
            if self.noun:
                raise fail("'{param}' may hold at most {cap} {noun} on this server, got {got}.",
                           cap=cap, noun=self.noun, got=size)
            raise fail("'{param}' may be at most {cap} on this server, got {got}.", cap=cap, got=size)
        return value


class Whole:
    """An array whose items' failures name the array itself ("stop", not "stop[2]")."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._wrap, handler(source))

    @staticmethod
    def _wrap(value: Any, handler: core_schema.ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            template, values = _template(error, top_level=False)
            raise fail(template, code=_code(error), **values) from None


def by_type(members: dict[str, type[ApiModel]], other: type[ApiModel], shown: int | None = None,
            default: str | None = None) -> Any:
    """An object of the model its `type` names (`default` when it has none), any other type parsed as
    `other`; the document shows the first `shown` members (all: None). Not pydantic's tagged union,
    whose tag would enter the param path."""

    def check(value: Any, info: ValidationInfo) -> ApiModel:
        kind = value.get("type") if isinstance(value, dict) else None
        kind = default if kind is None else kind
        model = members.get(kind, other) if isinstance(kind, str) else other
        return model.model_validate(value, context=info.context)  # its errors merge in below this value

    shown_as = Union[tuple(dict.fromkeys(list(members.values())[:shown]))]
    return Annotated[Any, PlainValidator(check, json_schema_input_type=shown_as)]


def text_or(item: Any, min_length: int = 0, items: str = "items") -> Any:
    """A string, or an array of at least `min_length` `item`s (`items`: what the message calls them)."""
    array = Annotated[list[item], Field(min_length=min_length)]
    adapter = TypeAdapter(array)

    def check(value: Any, info: ValidationInfo) -> str | list:
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise fail("'{param}' must be a string or an array of {items}.", items=items)
        return adapter.validate_python(value, context=info.context)

    return Annotated[Any, PlainValidator(check, json_schema_input_type=Union[str, array])]


def ignored(schema: Schema) -> Any:
    """A field accepted and not read (clients send it; it has no engine meaning): documented, not checked."""
    return Annotated[Any, WithJsonSchema(schema)]


def param_path(loc: tuple[str | int, ...], prefix: str = "") -> str:
    """('messages', 0, 'content') -> "messages[0].content"; `prefix` goes first ("reasoning.")."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path and not path.endswith(".") else part
    return path


_PYDANTIC_TYPES = frozenset(get_args(core_schema.ErrorType))
# Pydantic's own failures in today's words ({param}: the path; {input}: the value sent).
_PYDANTIC_MESSAGES = {
    "missing": "'{param}' is required.",
    "model_type": "'{param}' must be an object.",
    "dict_type": "'{param}' must be an object.",
    "list_type": "'{param}' must be an array.",
    "too_short": "'{param}' must not be empty.",
    "too_long": "'{param}' may hold at most {max_length} items, got {actual_length}.",
    "string_type": "'{param}' must be a string.",
    "string_too_short": "'{param}' must not be empty.",
    "string_pattern_mismatch": "'{param}' must match {pattern}, got {input}.",
    "bool_type": "'{param}' must be a boolean, got {input}.",
}


def _loc(error: dict[str, Any]) -> tuple[str | int, ...]:
    """Where an error is: its location, and below it the field a check named."""
    field = (error.get("ctx") or {}).get("field")
    below = () if field is None else field if isinstance(field, tuple) else (field,)
    return (*error["loc"], *below)


def _code(error: dict[str, Any]) -> str | None:
    return (error.get("ctx") or {}).get("code") if error["type"] == _CONDUIT else None


def _template(error: dict[str, Any], top_level: bool) -> tuple[str, dict[str, Any]]:
    """The error's message template (with {param}, maybe {path}) and its values."""
    values = {k: v for k, v in (error.get("ctx") or {}).items() if k not in ("template", "field", "code")}
    if error["type"] == _CONDUIT:
        return error["ctx"]["template"], values
    if error["type"] not in _PYDANTIC_TYPES:  # an API's own PydanticCustomError: its message, placeholders kept
        escaped = error["msg"].replace("{", "{{").replace("}", "}}")
        return escaped.replace("{{param}}", "{param}").replace("{{path}}", "{path}"), values
    if error["type"] == "missing" and top_level:
        article = "an" if str(error["loc"][0])[:1] in tuple("aeiou") else "a"
        return "you must provide " + article + " {param} parameter.", values  # OpenAI's words
    fallback = "'{param}': " + error["msg"].replace("{", "{{").replace("}", "}}") + "."
    return _PYDANTIC_MESSAGES.get(error["type"], fallback), {**values, "input": got(error.get("input"))}


def parse(model: type[M], body: Any, *, limits: RequestLimits = DEFAULT_LIMITS, prefix: str = "") -> M:
    """`body` validated as `model`; the first failure (in field order) raised as a 400 APIError whose
    `param` is its path in the body, after `prefix` (where the object sits in a larger body)."""
    try:
        return model.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = _loc(error)
        param = param_path(loc, prefix)
        template, values = _template(error, top_level=len(loc) == 1)
        path = ".".join(str(part) for part in (*prefix.split(".")[:-1], *loc))  # pydantic's (Anthropic's) spelling
        raise invalid(template.format(param=param, path=path, **values), param or None, _code(error)) from None
