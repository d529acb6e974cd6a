"""How schemas reach the grammar engine (engine_service/text/json_schemas.py, tools.py) and how the
engine's name for a bad tool schema reaches OpenAI's (http_shim/errors.py): no model needed."""

from __future__ import annotations

import json

import pytest

from conduit.v1 import engine_pb2 as pb
from engine_service.text.json_schemas import closed_objects, placed_at
from engine_service.text.tools import ToolSpec
from http_shim.errors import openai_param


def test_closed_objects_closes_schemas_and_leaves_property_maps_and_values_alone() -> None:
    schema = {"type": "object", "properties": {"properties": {"type": "string"}, "c": {"$ref": "#/$defs/C"}},
              "$defs": {"C": {"type": "object", "properties": {"x": {"type": "integer"}}}},
              "default": {"properties": {}}}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert set(closed["properties"]) == {"properties", "c"}, "a property named 'properties' is no schema"
    assert closed["$defs"]["C"]["additionalProperties"] is False
    assert closed["default"] == {"properties": {}}, "values are not schemas"
    assert closed_objects({"type": "object", "additionalProperties": True, "properties": {}})["additionalProperties"] is True


def test_placed_at_rewrites_every_local_ref_and_nothing_else() -> None:
    schema = {"properties": {"a": {"$ref": "#/$defs/A"}, "self": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
                             "far": {"$ref": "other.json#/x"}, "v": {"const": {"$ref": "#/not-a-ref"}}}}
    placed = placed_at(schema, "/anyOf/1/properties/arguments")
    assert placed["properties"]["a"] == {"$ref": "#/anyOf/1/properties/arguments/$defs/A"}
    assert placed["properties"]["self"]["anyOf"][0] == {"$ref": "#/anyOf/1/properties/arguments"}
    assert placed["properties"]["far"] == {"$ref": "other.json#/x"}
    assert placed["properties"]["v"] == {"const": {"$ref": "#/not-a-ref"}}


def spec(mode: int = pb.ToolChoice.MODE_AUTO, parallel: bool = True) -> ToolSpec:
    chat = pb.ChatInput(tools=[
        pb.Tool(name="f", parameters_json=json.dumps({"type": "object", "$defs": {"C": {"type": "integer"}},
                                                      "properties": {"c": {"$ref": "#/$defs/C"}}})),
        pb.Tool(name="g")], tool_choice=pb.ToolChoice(mode=mode), parallel_tool_calls=parallel)
    return ToolSpec.from_chat(chat)


def test_a_tools_refs_follow_it_into_the_call_grammar() -> None:
    grammar = json.loads(spec(pb.ToolChoice.MODE_REQUIRED).grammar())
    lark = grammar["grammars"][0]["lark_grammar"]
    body = json.loads(lark.split("%json ", 1)[1])
    f = body["anyOf"][0]["properties"]["arguments"]
    assert f["properties"]["c"] == {"$ref": "#/anyOf/0/properties/arguments/$defs/C"}
    assert [b["properties"]["name"]["const"] for b in body["anyOf"]] == ["f", "g"]


def test_on_auto_a_format_makes_calls_or_the_answer_and_one_outputs_calls_share_one_form() -> None:
    tools = spec()
    assert tools.grammar(None) is None, "auto without a format is free text"
    answer = json.dumps({"grammars": [{"name": "json_schema", "json_schema": {"type": "object"}}]})
    grammar = json.loads(tools.grammar(answer, bare_calls=True))
    calls, format_ = grammar["grammars"]
    assert format_ == {"name": "answer", "json_schema": {"type": "object"}}
    lark = calls["lark_grammar"]
    assert lark.startswith("start: calls | @answer\n")
    rule = next(line for line in lark.splitlines() if line.startswith("calls:"))
    assert rule == ('calls: "<tool_call>" body "</tool_call>" ("\\n" "<tool_call>" body "</tool_call>")* "\\n"? '
                    '| body ("\\n" body)* "\\n"?')
    tagged_only = json.loads(tools.grammar(answer))["grammars"][0]["lark_grammar"]
    assert "| body" not in tagged_only
    # Both argument keys the parser reads: "arguments", and Llama 3's "parameters".
    body = json.loads(lark.split("%json ", 1)[1])
    assert [next(k for k in b["properties"] if k != "name") for b in body["anyOf"]] == [
        "arguments", "parameters", "arguments", "parameters"]


def test_a_tool_schema_error_names_the_tool_by_its_place() -> None:
    tools = spec()
    error = tools.schema_error(lambda schema: "no good" if "$defs" not in schema else None)
    assert error.param == "chat.tools[1].parameters_json" and "tools[1] ('g')" in str(error)
    assert tools.schema_error(lambda schema: None) is None


def test_the_engines_tool_parameter_path_is_openais() -> None:
    assert openai_param("chat.tools[3].parameters_json") == "tools[3].function.parameters"
    assert openai_param("constraint") == "response_format"
    assert openai_param("sampling.top_p") == "top_p"


def test_a_json_answer_streams_once_its_first_key_is_no_call() -> None:
    tools = spec()
    assert tools.may_be_call('{"')
    assert tools.may_be_call('{"name": "f"')
    assert tools.may_be_call('[{"arguments"')
    assert not tools.may_be_call('{"answer": ')
    assert tools.may_be_call("<tool_")


def test_the_calls_branch_alone_is_the_calls_grammar_without_the_answer() -> None:
    """What the matcher follows to know whether an output on calls-or-answer took the calls."""
    answer = json.dumps({"grammars": [{"json_schema": {"type": "object"}}]})
    both = json.loads(spec().grammar(answer))
    calls = json.loads(ToolSpec.calls_only(json.dumps(both)))
    assert len(both["grammars"]) == 2 and len(calls["grammars"]) == 1
    lark = calls["grammars"][0]["lark_grammar"]
    assert lark.startswith("start: calls\n") and "@answer" not in lark
    assert lark.split("\n", 1)[1] == both["grammars"][0]["lark_grammar"].split("\n", 1)[1]
    with pytest.raises(ValueError):
        ToolSpec.calls_only(spec(pb.ToolChoice.MODE_REQUIRED).grammar())


def test_call_tags_that_are_special_tokens_are_named_by_id_in_the_grammar() -> None:
    as_text = spec(pb.ToolChoice.MODE_REQUIRED, parallel=False).grammar()
    assert 'calls: "<tool_call>" body "</tool_call>"\n' in json.loads(as_text)["grammars"][0]["lark_grammar"]
    tokens = {"<tool_call>": 151657, "</tool_call>": 151658}
    forced = spec(pb.ToolChoice.MODE_REQUIRED, parallel=False).grammar(tag_tokens=tokens)
    assert "calls: <[151657]> body <[151658]>\n" in json.loads(forced)["grammars"][0]["lark_grammar"]
    answer = json.dumps({"grammars": [{"name": "json_schema", "json_schema": {"type": "object"}}]})
    calls = json.loads(ToolSpec.calls_only(spec().grammar(answer, tag_tokens=tokens)))["grammars"][0]["lark_grammar"]
    assert "<[151657]> body <[151658]>" in calls and '"<tool_call>"' not in calls
