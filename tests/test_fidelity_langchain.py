"""LangChain's ChatOpenAI against the running stack: invoke, stream, bind_tools, with_structured_output."""

from __future__ import annotations

import pydantic
import pytest

from launcher.stack import Stack
from common import MODEL, QUESTION, WEATHER_QUESTION

pytestmark = pytest.mark.model

QUESTION_TEXT = QUESTION[0]["content"]


class GetWeather(pydantic.BaseModel):
    """Get the weather in a city."""

    city: str


class Cat(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def llm(stack: Stack):
    langchain_openai = pytest.importorskip("langchain_openai")  # here, not at collection: ~1 s to import
    return langchain_openai.ChatOpenAI(base_url=stack.base_url, api_key="unused", model=MODEL, temperature=0,
                                       max_tokens=40, max_retries=0, timeout=120)


def test_invoke(llm) -> None:
    message = llm.invoke(QUESTION_TEXT)
    assert "Paris" in message.content
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.usage_metadata["output_tokens"] > 0


def test_stream_equals_invoke(llm) -> None:
    whole = llm.invoke(QUESTION_TEXT).content
    chunks = list(llm.stream(QUESTION_TEXT))
    assert len(chunks) > 2
    assert "".join(chunk.content for chunk in chunks) == whole


def test_bind_tools_with_a_forced_call(llm) -> None:
    message = llm.bind_tools([GetWeather], tool_choice="GetWeather", parallel_tool_calls=False).invoke(
        WEATHER_QUESTION[0]["content"])
    assert not message.invalid_tool_calls
    (call,) = message.tool_calls
    assert call["name"] == "GetWeather" and call["id"]
    GetWeather.model_validate(call["args"])
    assert message.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(llm, method: str) -> None:
    # strict: the schema then forbids extra keys, which this small model otherwise adds until max_tokens.
    cat = llm.with_structured_output(Cat, method=method, strict=True).invoke("Describe a cat with its name and age.")
    assert isinstance(cat, Cat)
