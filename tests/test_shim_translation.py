"""Unit tests of the shim's pure translation code: OpenAI JSON -> proto, proto -> OpenAI, errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import grpc
import pytest

from clients.errors import from_rpc_error
from conduit.v1 import engine_pb2 as pb
from http_shim.errors import APIError, from_engine_error
from http_shim.openai.request import parse_chat, parse_completion
from http_shim.web import check_body
from http_shim.openai.response import (
    ChatStreamTranslator,
    Collector,
    CompletionStreamTranslator,
    chat_response,
    completion_response,
)
from http_shim.protocol.logprobs import logprob_value

USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat({"model": "m", "messages": USER, **fields}, "chatcmpl-1")


def completion(**fields):
    return parse_completion({"model": "m", "prompt": "hi", **fields}, "cmpl-1")


def rejected(parse, body) -> APIError:
    with pytest.raises(APIError) as info:
        parse(body, "id")
    assert info.value.status == 400
    return info.value


# ------------------------------------------------------------------ chat requests


def test_chat_defaults_leave_optional_fields_unset():
    request = chat().requests[0]
    assert request.request_id == "chatcmpl-1" and request.model == "m"
    assert not request.sampling.HasField("temperature") and not request.sampling.HasField("top_p")
    assert not request.stopping.HasField("max_tokens")
    assert request.n == 1 and not request.logprobs and not request.HasField("constraint")


def test_chat_messages_map_roles_parts_names_and_tool_turns():
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    out = parse_chat({"model": "m", "messages": messages}, "id").requests[0].chat.messages
    assert [m.role for m in out] == ["developer", "user", "assistant", "tool"]
    assert out[1].content == "a\nb" and out[1].name == "ann"
    assert out[2].content == "" and out[2].tool_calls[0] == pb.ToolCall(id="c1", name="f", arguments='{"x": 1}')
    assert out[3].tool_call_id == "c1" and out[3].content == "42"


def test_chat_sampling_and_stopping_fields():
    request = chat(
        temperature=0,
        top_p=0.5,
        presence_penalty=-1,
        frequency_penalty=1.5,
        seed=-1,
        logit_bias={"7": -100, "9": 5.5},
        stop="END",
        max_tokens=10,
        max_completion_tokens=20,
        top_k=-1,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=3,
        ignore_eos=True,
        stop_token_ids=[2, 3],
        n=3,
        logprobs=True,
        top_logprobs=4,
    ).requests[0]
    s, t = request.sampling, request.stopping
    assert s.HasField("temperature") and s.temperature == 0
    assert s.top_p == 0.5 and s.presence_penalty == -1 and s.frequency_penalty == 1.5
    assert s.seed == 2**64 - 1  # signed OpenAI seeds wrap into the engine's unsigned range
    assert dict(s.logit_bias) == {7: -100.0, 9: 5.5}
    assert (
        s.top_k == 0
        and math.isclose(s.min_p, 0.1, rel_tol=1e-6)
        and math.isclose(s.repetition_penalty, 1.2, rel_tol=1e-6)
    )
    assert list(t.stop) == ["END"] and t.max_tokens == 20  # max_completion_tokens wins
    assert t.min_tokens == 3 and t.ignore_eos and list(t.stop_token_ids) == [2, 3]
    assert request.n == 3 and request.logprobs and request.top_logprobs == 4


def test_chat_response_formats_become_constraints():
    assert chat(response_format={"type": "text"}).requests[0].HasField("constraint") is False
    assert chat(response_format={"type": "json_object"}).requests[0].constraint.json_object
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert json.loads(chat(response_format=fmt).requests[0].constraint.json_schema) == schema
    assert chat(structured_outputs={"regex": "[0-9]+"}).requests[0].constraint.regex == "[0-9]+"
    assert chat(structured_outputs={"grammar": "start: 'a'"}).requests[0].constraint.grammar == "start: 'a'"


def test_chat_tools_and_tool_choice():
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}
    ]
    plan = chat(
        tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False
    )
    c = plan.requests[0].chat
    assert c.tools[0] == pb.Tool(name="get_weather", description="d", parameters_json='{"type": "object"}')
    assert c.tool_choice == pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name="get_weather")
    assert c.HasField("parallel_tool_calls") and not c.parallel_tool_calls
    assert chat(tools=tools, tool_choice="required").requests[0].chat.tool_choice.mode == pb.ToolChoice.MODE_REQUIRED
    assert chat(tool_choice="none").requests[0].chat.tool_choice.mode == pb.ToolChoice.MODE_NONE


def test_chat_stream_options_and_ignored_extras():
    plan = chat(
        stream=True, stream_options={"include_usage": True}, user="u", metadata={"k": "v"}, store=False, whatever=1
    )
    assert plan.stream and plan.include_usage
    assert not chat(stream_options={"include_usage": True}).include_usage  # only meaningful when streaming


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"model": None}, "model"),
        ({"model": 5}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"n": 1.5}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"seed": "x"}, "seed"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 3}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream": "true"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{nope"}}},
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"min_p": 2}, "min_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_chat_rejects_bad_fields_naming_the_param(fields, param):
    error = rejected(parse_chat, {"model": "m", "messages": USER, **fields})
    assert error.param == param
    assert error.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [[1, 2], "x", {"messages": [{"content": "a\ud800"}]}])
def test_body_must_be_an_object_of_valid_unicode(body):
    with pytest.raises(APIError) as info:
        check_body(body)
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_huge_integers_are_a_400_not_an_overflow():
    assert rejected(parse_chat, {"model": "m", "messages": USER, "temperature": 10**400}).param == "temperature"
    assert rejected(parse_chat, {"model": "m", "messages": USER, "logit_bias": {"1": 10**400}}).param == "logit_bias"


# ------------------------------------------------------------------ completion requests


def test_completion_prompt_forms():
    assert [r.text for r in completion(prompt="a").requests] == ["a"]
    assert [r.text for r in completion(prompt=["a", "b"]).requests] == ["a", "b"]
    assert [r.request_id for r in completion(prompt=["a", "b"]).requests] == ["cmpl-1-0", "cmpl-1-1"]
    assert [list(r.token_ids.ids) for r in completion(prompt=[1, 2, 3]).requests] == [[1, 2, 3]]
    assert [list(r.token_ids.ids) for r in completion(prompt=[[1], [2, 3]]).requests] == [[1], [2, 3]]


def test_completion_defaults_and_options():
    plan = completion()
    assert plan.requests[0].stopping.max_tokens == 16  # OpenAI's default for /v1/completions
    assert completion(max_tokens=0, echo=True).requests[0].stopping.max_tokens == 0
    plan = completion(logprobs=3, echo=True, n=2, best_of=4, suffix="")
    request = plan.requests[0]
    assert request.logprobs and request.top_logprobs == 3 and request.echo and request.n == 4
    assert plan.n == 2 and plan.best_of == 4 and plan.logprobs and plan.echo
    ranked_only = completion(n=1, best_of=2)
    assert ranked_only.requests[0].logprobs and not ranked_only.logprobs  # logprobs fetched only to rank


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": None}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"prompt": [[1], []]}, "prompt[1]"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": ["x"] * 65}, "prompt"),
        ({"suffix": "tail"}, "suffix"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"best_of": 3, "n": 2, "stream": True}, "best_of"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"echo": "yes"}, "echo"),
        ({"max_tokens": -1}, "max_tokens"),
    ],
)
def test_completion_rejects_bad_fields(fields, param):
    assert rejected(parse_completion, {"model": "m", "prompt": "hi", **fields}).param == param


# ------------------------------------------------------------------ responses


def prompt_info(tokens=3, **kw):
    return pb.GenerateResponse(prompt=pb.PromptInfo(prompt_tokens=tokens, **kw))


def chunk(index, text, **kw):
    return pb.GenerateResponse(chunk=pb.Chunk(index=index, text=text, **kw))


def final(index, reason=pb.FINISH_REASON_STOP, completion_tokens=1, **kw):
    return pb.GenerateResponse(
        final=pb.Final(index=index, finish_reason=reason, completion_tokens=completion_tokens, **kw)
    )


def lp(token, value, top=()):
    return pb.TokenLogprob(
        token=token,
        logprob=value,
        bytes=token.encode(),
        top_logprobs=[pb.TopLogprob(token=t, logprob=v) for t, v in top],
    )


def test_logprob_values_are_json_safe():
    assert logprob_value(float("nan")) is None
    assert logprob_value(float("-inf")) == -9999.0
    assert logprob_value(-1.5) == -1.5


def test_chat_response_from_collected_stream():
    plan = chat(n=2, logprobs=True, top_logprobs=1)
    collected = Collector()
    for response in [
        prompt_info(7),
        chunk(1, "B", logprobs=[lp("B", -0.5, [("B", -0.5)])]),
        chunk(0, "A1", logprobs=[lp("A1", -0.25)]),
        chunk(0, "A2"),
        final(0, pb.FINISH_REASON_LENGTH, 2),
        final(1, completion_tokens=1),
    ]:
        collected.add(0, response)
    body = chat_response("chatcmpl-x", 5, "m", plan, collected)
    assert body["object"] == "chat.completion" and body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    first, second = body["choices"]
    assert first["message"] == {"role": "assistant", "content": "A1A2", "refusal": None}
    assert first["finish_reason"] == "length" and second["finish_reason"] == "stop"
    assert second["logprobs"]["content"] == [
        {"token": "B", "logprob": -0.5, "bytes": [66], "top_logprobs": [{"token": "B", "logprob": -0.5, "bytes": [66]}]}
    ]


def test_chat_response_tool_calls():
    collected = Collector()
    call = pb.ToolCall(id="call_1", name="f", arguments="{}")
    for response in [prompt_info(), final(0, pb.FINISH_REASON_TOOL_CALLS, tool_calls=[call])]:
        collected.add(0, response)
    choice = chat_response("id", 1, "m", chat(), collected)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]


def test_completion_best_of_returns_the_highest_cumulative_logprob():
    plan = completion(n=1, best_of=3)
    collected = Collector()
    collected.add(0, prompt_info(2))
    for i, value in enumerate([-3.0, -0.5, -2.0]):
        collected.add(0, chunk(i, f"c{i}", logprobs=[lp(f"c{i}", value)]))
        collected.add(0, final(i))
    body = completion_response("cmpl-x", 1, "m", plan, collected)
    assert [c["text"] for c in body["choices"]] == ["c1"]
    assert body["choices"][0]["logprobs"] is None  # fetched to rank, not asked for
    assert body["usage"]["completion_tokens"] == 3  # every generated candidate counts


def test_completion_echo_logprobs_and_prompt_numbering():
    plan = completion(prompt=["a b", "c"], n=2, echo=True, logprobs=1)
    collected = Collector()
    for p, words in enumerate([["a", " b"], ["c"]]):
        prompt_lps = [lp(w, float("nan") if k == 0 else -1.0, [(w, -1.0)]) for k, w in enumerate(words)]
        collected.add(p, prompt_info(len(words), prompt_text="".join(words), prompt_logprobs=prompt_lps))
        for i in range(2):
            collected.add(p, chunk(i, "!", logprobs=[lp("!", -0.5, [("!", -0.5)])]))
            collected.add(p, final(i))
    choices = completion_response("cmpl-x", 1, "m", plan, collected)["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["text"] for c in choices] == ["a b!", "a b!", "c!", "c!"]
    assert choices[0]["logprobs"] == {
        "tokens": ["a", " b", "!"],
        "token_logprobs": [None, -1.0, -0.5],
        "top_logprobs": [None, {" b": -1.0}, {"!": -0.5}],
        "text_offset": [0, 1, 3],
    }


def test_chat_stream_chunks_sequence_with_tool_calls_and_usage():
    plan = chat(n=2, stream=True, stream_options={"include_usage": True})
    t = ChatStreamTranslator("chatcmpl-x", 9, "m", plan)
    out = t.on_response(0, prompt_info(4))
    assert [c["choices"][0]["delta"] for c in out] == [{"role": "assistant", "content": ""}] * 2
    assert [c["choices"][0]["index"] for c in out] == [0, 1]
    assert all(c["usage"] is None and c["object"] == "chat.completion.chunk" for c in out)
    assert t.on_response(0, chunk(0, "", completion_tokens=1)) == []  # nothing to say yet
    (c,) = t.on_response(0, chunk(1, "hi", completion_tokens=1))
    assert c["choices"] == [{"index": 1, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}]
    first = pb.ToolCallDelta(index=0, id="call_a", name="f", arguments='{"x"')
    (c,) = t.on_response(0, pb.GenerateResponse(chunk=pb.Chunk(index=0, tool_calls=[first], completion_tokens=2)))
    assert c["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x"'}}
    ]
    rest = pb.ToolCallDelta(index=0, arguments=": 1}")
    (c,) = t.on_response(0, pb.GenerateResponse(chunk=pb.Chunk(index=0, tool_calls=[rest], completion_tokens=3)))
    assert c["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": ": 1}"}}]
    (c,) = t.on_response(0, final(0, pb.FINISH_REASON_TOOL_CALLS, 3))
    assert c["choices"][0]["finish_reason"] == "tool_calls" and c["choices"][0]["delta"] == {}
    t.on_response(0, final(1, completion_tokens=1))
    (usage_chunk,) = t.finish()
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }



def test_a_chunk_with_several_pieces_of_a_call_sends_one_entry_per_call() -> None:
    """A grouped message (--stream-interval) may hold a call's header and argument pieces, and
    a second call's: the SSE chunk has one tool_calls entry per call, pieces joined in order."""
    t = ChatStreamTranslator("chatcmpl-1", 0, "m", chat(stream=True))
    t.on_response(0, prompt_info(4))
    pieces = [pb.ToolCallDelta(index=0, id="call_a", name="f", arguments=""),
              pb.ToolCallDelta(index=0, arguments='{"x"'), pb.ToolCallDelta(index=0, arguments=": 1}"),
              pb.ToolCallDelta(index=1, id="call_b", name="g", arguments="{}")]
    (c,) = t.on_response(0, pb.GenerateResponse(chunk=pb.Chunk(index=0, tool_calls=pieces, completion_tokens=4)))
    assert c["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    more = [pb.ToolCallDelta(index=1, arguments=""), pb.ToolCallDelta(index=0, arguments=" ")]
    (c,) = t.on_response(0, pb.GenerateResponse(chunk=pb.Chunk(index=0, tool_calls=more, completion_tokens=5)))
    assert c["choices"][0]["delta"]["tool_calls"] == [{"index": 1, "function": {"arguments": ""}},
                                                      {"index": 0, "function": {"arguments": " "}}]


def test_chat_stream_whole_tool_calls_when_engine_sent_no_pieces():
    t = ChatStreamTranslator("id", 1, "m", chat(stream=True))
    call = pb.ToolCall(id="call_z", name="f", arguments="{}")
    calls, finish = t.on_response(0, final(0, pb.FINISH_REASON_TOOL_CALLS, tool_calls=[call]))
    assert calls["choices"][0]["delta"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert finish["choices"][0]["finish_reason"] == "tool_calls"
    assert "usage" not in finish  # only present when include_usage was asked for


def test_completion_stream_echo_offsets_and_prompt_numbering():
    plan = completion(prompt=["ab", "c"], stream=True, echo=True, logprobs=0)
    t = CompletionStreamTranslator("cmpl-x", 1, "m", plan)
    (echo,) = t.on_response(1, prompt_info(1, prompt_text="c", prompt_logprobs=[lp("c", float("nan"))]))
    assert echo["choices"][0]["index"] == 1 and echo["choices"][0]["text"] == "c"
    assert echo["choices"][0]["logprobs"]["token_logprobs"] == [None]
    (c,) = t.on_response(1, chunk(0, "de", logprobs=[lp("d", -1.0), lp("e", -2.0)]))
    assert c["choices"][0]["text"] == "de" and c["choices"][0]["logprobs"]["text_offset"] == [1, 2]
    (f,) = t.on_response(1, final(0))
    assert f["choices"][0] == {"index": 1, "text": "", "logprobs": None, "finish_reason": "stop"}


# ------------------------------------------------------------------ errors


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details="boom", trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


def from_grpc(error):
    """A failed call as the shim sees it: the client library's ConduitError, then an APIError."""
    return from_engine_error(from_rpc_error(error))


@pytest.mark.parametrize(
    "code, status",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.CANCELLED, 499),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.UNKNOWN, 500),
    ],
)
def test_grpc_codes_map_to_http_statuses(code, status):
    error = from_grpc(FakeRpcError(code, "details here"))
    assert error.status == status
    assert "details here" in error.body()["error"]["message"]


def test_resource_exhausted_carries_retry_after():
    assert from_grpc(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED)).headers == {"Retry-After": "1"}
    suggested = FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, trailing=(("retry-after", "7"),))
    assert from_grpc(suggested).headers == {"Retry-After": "7"}
    assert from_grpc(FakeRpcError(grpc.StatusCode.NOT_FOUND)).code == "model_not_found"


def test_echo_falls_back_to_the_prompt_as_sent():
    plan = completion(prompt="ab", echo=True)
    collected = Collector()
    collected.add(0, prompt_info(1))  # an engine that left prompt_text empty
    collected.add(0, chunk(0, "c"))
    collected.add(0, final(0))
    assert completion_response("id", 1, "m", plan, collected)["choices"][0]["text"] == "abc"


def test_the_shim_never_imports_torch():
    code = "import sys, http_shim.app, http_shim.connection; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def responses_output(*responses: pb.GenerateResponse) -> tuple[list[dict], list[str]]:
    """A Responses answer with logprobs asked for, written from `responses`: its output items, and its events' types."""
    from http_shim.responses.events import ResponseEvents
    from http_shim.responses.objects import ResponseSkeleton

    writer = ResponseEvents(ResponseSkeleton("resp_1", "m", {}), logprobs=True)
    events = [e for response in responses for e in writer.on_response(0, response)] + writer.finish()
    return writer.final["output"], [json.loads(e.split(b"data: ")[1])["type"] for e in events]


def test_a_thinking_models_logprobs_leave_its_reasoning_item_whole():
    """Logprobs come with every token, the thinking's too: they must not open a message mid-thought (the
    thinking was split into as many reasoning items as it had chunks). The message's are the answer's."""
    (reasoning, message), _ = responses_output(
        prompt_info(3), chunk(0, "", logprobs=[lp("<think>", -0.05)]),
        chunk(0, "", reasoning_text="Let me", logprobs=[lp("Let", -0.1), lp(" me", -0.2)]),
        chunk(0, "", reasoning_text=" think.", logprobs=[lp(" think.", -0.3)]),
        chunk(0, "", logprobs=[lp("</think>", -0.4)]), chunk(0, "Hi", logprobs=[lp("Hi", -0.5)]),
        final(0, completion_tokens=6))
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "Let me think."
    assert message["content"][0]["text"] == "Hi"
    assert [entry["token"] for entry in message["content"][0]["logprobs"]] == ["Hi"]


def test_a_calls_logprobs_open_no_message_before_it():
    """The call's own tokens carry logprobs and no text: a function call item has no place for them, and an
    empty message before the call (as there was) is not the answer's."""
    call = pb.ToolCallDelta(index=0, id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    output, _ = responses_output(prompt_info(3), chunk(0, "", tool_calls=[call], logprobs=[lp("<call>", -0.1)]),
                                 final(0, pb.FINISH_REASON_TOOL_CALLS, completion_tokens=1))
    assert [item["type"] for item in output] == ["function_call"]


def test_logprobs_of_half_a_character_go_with_its_text():
    """A token that writes no text yet (half of a two-token character) keeps its logprobs: they come with the
    character's text; and with an empty message when the answer ends before it."""
    output, kinds = responses_output(prompt_info(3), chunk(0, "", logprobs=[lp("\\xc3", -0.1)]),
                                     chunk(0, "é", logprobs=[lp("\\xa9", -0.2)]), final(0, completion_tokens=2))
    assert [entry["logprob"] for entry in output[0]["content"][0]["logprobs"]] == pytest.approx([-0.1, -0.2])
    assert kinds.count("response.output_text.delta") == 1
    (message,), _ = responses_output(prompt_info(3), chunk(0, "", logprobs=[lp("\\xc3", -0.1)]),
                                     final(0, pb.FINISH_REASON_LENGTH, completion_tokens=1))
    assert message["content"][0]["text"] == "" and len(message["content"][0]["logprobs"]) == 1
