"""The shim's protocol base (http_shim/protocol/): typed request models whose validation errors are
today's 400s naming the OpenAI `param`, operator caps from the runtime limits, and the generated
/openapi.json agreeing with the checks."""

from __future__ import annotations

import json
import re
from typing import Annotated

import pytest
from pydantic import field_validator
from pydantic_core import PydanticCustomError

from http_shim.errors import APIError
from http_shim.limits import DEFAULT_LIMITS, RequestLimits
from http_shim.openai.request import parse_chat
from http_shim.protocol.base import ApiModel, Cap, Str, by_type, fail, int_in, parse, text_or
from http_shim.openapi_document import openapi_document


class Item(ApiModel):
    count: Annotated[int_in(1, 100), Cap("max_n")]


class Body(ApiModel):
    model: Str
    items: list[Item] = []


def refusal(body: object, limits: RequestLimits = DEFAULT_LIMITS) -> tuple[str, str]:
    with pytest.raises(APIError) as info:
        parse(Body, body, limits=limits)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value.param, info.value.message


def test_integers_take_whole_floats_and_refuse_bools_and_strings() -> None:
    assert parse(Body, {"model": "m", "items": [{"count": 2.0}]}).items[0].count == 2
    assert refusal({"model": "m", "items": [{"count": True}]}) == (
        "items[0].count", "'items[0].count' must be an integer, got true.")
    assert refusal({"model": "m", "items": [{}, {"count": "2"}]})[0] == "items[0].count"
    assert refusal({"model": "m", "items": [{"count": 101}]})[1] == "'items[0].count' must be between 1 and 100, got 101."


def test_missing_null_and_unknown_fields() -> None:
    assert refusal({"model": None}) == ("model", "you must provide a model parameter.")
    assert parse(Body, {"model": "m", "items": None, "whatever": 1}).items == []  # null is left out; extras ignored
    assert refusal({"model": "m", "items": [5]}) == ("items[0]", "'items[0]' must be an object.")


def test_caps_come_from_the_limits_given() -> None:
    body = {"model": "m", "items": [{"count": 5}]}
    assert parse(Body, body).items[0].count == 5
    assert refusal(body, RequestLimits(max_n=4)) == ("items[0].count", "'items[0].count' may be at most 4 on this "
                                                                        "server, got 5.")


def test_an_apis_own_error_keeps_its_message_with_both_paths() -> None:
    class Anthropic(ApiModel):
        roles: list[Str]

        @field_validator("roles")
        @classmethod
        def _check(cls, roles: list[str]) -> list[str]:
            raise PydanticCustomError("anthropic", "{path}: unexpected role (OpenAI: {param})")

    with pytest.raises(APIError) as info:
        parse(Anthropic, {"roles": ["x"]}, prefix="input.")
    assert (info.value.param, info.value.message) == ("input.roles", "input.roles: unexpected role (OpenAI: input.roles)")


def test_the_document_states_the_servers_limits_in_openapi_3_0() -> None:
    document = openapi_document(RequestLimits(max_tokens=64, max_n=2, max_stop=3), auth_required=False)
    text = json.dumps(document["components"])
    assert '"x-cap"' not in text and '"title"' not in text and '{"type": "null"}' not in text
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["model", "messages"]
    assert chat["properties"]["max_completion_tokens"] == {"maximum": 64, "minimum": 1, "type": "integer",
                                                           "nullable": True}
    assert chat["properties"]["n"]["maximum"] == 2 and chat["properties"]["stop"]["oneOf"][1]["maxItems"] == 3


def test_the_documented_logit_bias_keys_are_the_accepted_ones() -> None:
    """The hand-written document allowed 9 digits where the parser took 10 (issue 41)."""
    schema = openapi_document(DEFAULT_LIMITS, auth_required=False)["components"]["schemas"]
    pattern = schema["ChatCompletionRequest"]["properties"]["logit_bias"]["propertyNames"]["pattern"]
    largest = str(2**32 - 1)
    assert re.fullmatch(pattern, largest)
    request = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                          "logit_bias": {largest: 1}}, "id").requests[0]
    assert dict(request.sampling.logit_bias) == {2**32 - 1: 1.0}


def test_unions_by_type_and_text_name_the_place_and_carry_a_code() -> None:
    class Text(ApiModel):
        type: Str = "text"
        text: Str

    class Refused(ApiModel):
        type: Str

        @field_validator("type")
        @classmethod
        def _refuse(cls, kind: str) -> str:
            raise fail("'{param}' {got} is not supported.", code="unsupported_value", got=kind)

    class Turn(ApiModel):
        content: text_or(by_type({"text": Text}, Refused, default="text"), min_length=1, items="blocks")

    assert parse(Turn, {"content": [{"text": "a"}]}).content[0].text == "a"
    with pytest.raises(APIError) as info:
        parse(Turn, {"content": [{"type": "text", "text": "a"}, {"type": "text"}]})
    assert info.value.param == "content[1].text"
    with pytest.raises(APIError) as info:
        parse(Turn, {"content": [{"type": "image"}]})
    assert (info.value.param, info.value.code) == ("content[0].type", "unsupported_value")
    assert info.value.message == "'content[0].type' image is not supported."
    assert refusal_of(Turn, {"content": 5}) == ("content", "'content' must be a string or an array of blocks.")
    assert refusal_of(Turn, {"content": []}) == ("content", "'content' must not be empty.")


def refusal_of(model: type[ApiModel], body: dict) -> tuple[str, str]:
    with pytest.raises(APIError) as info:
        parse(model, body)
    return info.value.param, info.value.message
