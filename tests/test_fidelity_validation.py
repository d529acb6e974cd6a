"""Validation: bad requests get OpenAI's status codes and error shape, naming the `param`, and a
sweep of malformed requests over plain HTTP never gets a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from clients import EngineClient
from launcher.stack import Stack
from common import MODEL, ask, text_of

pytestmark = pytest.mark.model

HI = [{"role": "user", "content": "Hi"}]
LONG_TEXT = "hello " * 9000  # over the 8192-token context
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def error_of(caught: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    """The OpenAI error object: message, type, param and code are all present."""
    body = caught.value.response.json()
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    return error


def chat_error(client: openai.OpenAI, **params: Any) -> tuple[int, dict[str, Any]]:
    request = {"model": MODEL, "messages": HI, "max_tokens": 2, **params}
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**request)
    return caught.value.status_code, error_of(caught)


def completion_error(client: openai.OpenAI, **params: Any) -> tuple[int, dict[str, Any]]:
    request = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **params}
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**request)
    return caught.value.status_code, error_of(caught)


CHAT_CASES: list[Any] = [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"n": 1.5}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"seed": "abc"}, "seed"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 3}, "logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"extra_body": {"top_k": -2}}, "top_k"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
    ({"extra_body": {"ignore_eos": "yes"}}, "ignore_eos"),
    ({"extra_body": {"stop_token_ids": [-1]}}, "stop_token_ids"),
    ({"extra_body": {"structured_outputs": {}}}, "structured_outputs"),
    ({"model": None}, "model"),
    ({"logit_bias": {"99999999": 5}}, "logit_bias"),
    ({"extra_body": {"stop_token_ids": [99999999]}}, "stop_token_ids"),
    ({"extra_body": {"min_tokens": 5}}, "min_tokens"),
    ({"extra_body": {"structured_outputs": {"regex": "("}}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
        "response_format"),
]


@pytest.mark.parametrize("params, param", CHAT_CASES, ids=lambda v: json.dumps(v)[:60] if isinstance(v, dict) else v)
def test_bad_chat_request_names_the_param(openai_client: openai.OpenAI, params: dict[str, Any], param: str) -> None:
    status, error = chat_error(openai_client, **params)
    assert status == 400
    assert error["param"] is not None and error["param"].startswith(param), error


COMPLETION_CASES: list[Any] = [
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt[0]"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"suffix": " and that is all."}, "suffix"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"best_of": 2, "stream": True}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"echo": "yes"}, "echo"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"prompt": [99999999]}, "prompt"),
]


@pytest.mark.parametrize("params, param", COMPLETION_CASES,
                         ids=lambda v: json.dumps(v)[:60] if isinstance(v, dict) else v)
def test_bad_completion_request_names_the_param(openai_client: openai.OpenAI, params: dict[str, Any],
                                                param: str) -> None:
    status, error = completion_error(openai_client, **params)
    assert status == 400
    assert error["param"] is not None and error["param"].startswith(param), error


def test_suffix_is_refused_with_a_clear_message(openai_client: openai.OpenAI) -> None:
    _, error = completion_error(openai_client, suffix="!")
    assert "suffix" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_404_naming_model(openai_client: openai.OpenAI, stream: bool) -> None:
    status, error = chat_error(openai_client, model="no-such-model", stream=stream)
    assert status == 404
    assert error["param"] == "model" and error["code"] == "model_not_found"
    status, error = completion_error(openai_client, model="no-such-model", stream=stream)
    assert (status, error["param"]) == (404, "model")


def test_bad_streamed_request_fails_before_the_stream(openai_client: openai.OpenAI) -> None:
    status, error = chat_error(openai_client, stream=True, temperature=-1)
    assert (status, error["param"]) == (400, "temperature")


def test_prompt_over_the_context_says_limit_and_count(openai_client: openai.OpenAI,
                                                     engine_client: EngineClient) -> None:
    messages = [{"role": "user", "content": LONG_TEXT}]
    count = len(engine_client.tokenize(messages=messages).token_ids)
    status, error = chat_error(openai_client, messages=messages)
    assert status == 400
    assert "8192" in error["message"] and str(count) in error["message"]
    status, error = completion_error(openai_client, prompt=LONG_TEXT)
    assert status == 400
    assert "8192" in error["message"] and str(len(engine_client.tokenize(LONG_TEXT).token_ids)) in error["message"]


def test_prompt_over_the_context_names_the_param(openai_client: openai.OpenAI) -> None:
    _, error = chat_error(openai_client, messages=[{"role": "user", "content": LONG_TEXT}])
    assert error["param"] == "messages"
    assert error["code"] == "context_length_exceeded"
    _, error = completion_error(openai_client, prompt=LONG_TEXT)
    assert error["param"] == "prompt"


# ------------------------------------------------------------------ the no-500 sweep

CHAT = "/chat/completions"
COMPLETIONS = "/completions"


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HI, "max_tokens": 2, **fields}


def completion_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hi", "max_tokens": 2, **fields}


SWEEP: list[tuple[str, Any]] = [
    (CHAT, b"{not json"),
    (CHAT, b""),
    (CHAT, b"[]"),
    (CHAT, b"null"),
    (CHAT, b'"a string"'),
    (CHAT, b'{"model": "\\ud800", "messages": []}'),
    (CHAT, b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'),
    (CHAT, b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "top_p": 1e999}'),
    (CHAT, b"\xff\xfe\x00garbage"),
    (CHAT, chat_body(messages=[None])),
    (CHAT, chat_body(messages=[[]])),
    (CHAT, chat_body(messages=[{"role": "user", "content": 42}])),
    (CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "text"}]}])),
    (CHAT, chat_body(messages=[{"role": "user", "content": [None]}])),
    (CHAT, chat_body(messages=[{"role": "assistant", "tool_calls": [{"function": None}]}])),
    (CHAT, chat_body(messages=[{"role": "assistant", "tool_calls": "x"}])),
    (CHAT, chat_body(messages=[{"role": "user", "content": "Hi", "name": 7}])),
    (CHAT, chat_body(max_tokens=2**70)),
    (CHAT, chat_body(seed=2**80)),
    (CHAT, chat_body(n=True)),
    (CHAT, chat_body(logit_bias=[1, 2])),
    (CHAT, chat_body(logit_bias={"-5": 1})),
    (CHAT, chat_body(stop=[1, 2])),
    (CHAT, chat_body(stop={"a": 1})),
    (CHAT, chat_body(tools=[{}])),
    (CHAT, chat_body(tools=[{"type": "function", "function": {"name": "f", "parameters": "not json"}}])),
    (CHAT, chat_body(tools=[TOOL], tool_choice={"type": "function"})),
    (CHAT, chat_body(tools=[TOOL], tool_choice=5)),
    (CHAT, chat_body(response_format="json")),
    (CHAT, chat_body(response_format={"type": "json_schema"})),
    (CHAT, chat_body(response_format={"type": "json_schema", "json_schema": {"schema": 5}})),
    (CHAT, chat_body(structured_outputs={"grammar": "start: ???"})),
    (CHAT, chat_body(stream_options=[], stream=True)),
    (CHAT, chat_body(model=["a"])),
    (CHAT, chat_body(model="")),
    (COMPLETIONS, completion_body(prompt={"a": 1})),
    (COMPLETIONS, completion_body(prompt=[[1, 2], "a"])),
    (COMPLETIONS, completion_body(prompt=[[1, -2]])),
    (COMPLETIONS, completion_body(prompt=[[1]] * 65)),
    (COMPLETIONS, completion_body(prompt=2**40)),
    (COMPLETIONS, completion_body(suffix=5)),
    (COMPLETIONS, completion_body(best_of="two")),
    (COMPLETIONS, completion_body(logprobs=-1)),
    (COMPLETIONS, completion_body(max_tokens=0)),
    (COMPLETIONS, completion_body(echo=True, logprobs=5, stream=True, n=17)),
]


def test_no_bad_request_gets_a_500(stack: Stack, openai_client: openai.OpenAI) -> None:
    failures = []
    with httpx.Client(base_url=stack.base_url, timeout=60) as http:
        for path, body in SWEEP:
            if isinstance(body, bytes):
                response = http.post(path, content=body, headers={"Content-Type": "application/json"})
            else:
                response = http.post(path, json=body)
            error = response.json().get("error") if response.headers.get("content-type", "").startswith(
                "application/json") else None
            if not (400 <= response.status_code < 500 and error and error.get("message")):
                failures.append((path, body, response.status_code, response.text[:200]))
    assert not failures, "\n".join(map(repr, failures))
    stack.check_alive()
    assert "Paris" in text_of(ask(openai_client))  # and the engine still answers right
