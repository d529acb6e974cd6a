"""Bad requests through the openai SDK get OpenAI-shaped 4xx errors, and the stack stays up."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from clients.launch import Stack

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def assert_openai_error(error: openai.APIStatusError, status: int) -> None:
    assert error.status_code == status
    body: Any = error.body
    assert isinstance(body, dict) and body.get("message"), f"no OpenAI error object in {error.response.text!r}"
    assert body.get("type")


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_404(openai_client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.chat.completions.create(model="no-such-model", messages=QUESTION, stream=stream)
    assert_openai_error(caught.value, 404)


def test_unknown_model_completions_is_404(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.completions.create(model="no-such-model", prompt="Hello")
    assert_openai_error(caught.value, 404)


@pytest.mark.parametrize("params", [
    {"temperature": 5},
    {"top_p": 1.5},
    {"n": 0},
    {"max_tokens": -1},
    {"messages": []},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"logprobs": True, "top_logprobs": 50},
], ids=lambda params: ",".join(params))
def test_bad_chat_params_are_400(openai_client: openai.OpenAI, params: dict[str, Any]) -> None:
    request = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, **params}
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(**request)
    assert_openai_error(caught.value, 400)


def test_prompt_over_the_context_is_400(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.completions.create(model=MODEL, prompt="hello " * 9000, max_tokens=4)
    assert_openai_error(caught.value, 400)


def test_malformed_json_is_400(stack: Stack) -> None:
    # The SDK always sends valid JSON, so this one goes over plain HTTP.
    request = urllib.request.Request(f"{stack.base_url}/chat/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    assert json.loads(caught.value.read())["error"]["message"]


def test_stack_survives_bad_requests(openai_client: openai.OpenAI, stack: Stack) -> None:
    for params in ({"temperature": 9}, {"model": "no-such-model"}):
        with pytest.raises(openai.APIStatusError):
            openai_client.chat.completions.create(**{"model": MODEL, "messages": QUESTION, **params})
    stack.check_alive()
    response = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    assert "Paris" in response.choices[0].message.content
