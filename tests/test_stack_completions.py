"""Legacy text completions and /v1/models through the official openai SDK (each completions field on
its own: test_fidelity_fields.py)."""

from __future__ import annotations

import openai
import pytest

from clients import EngineClient
from common import MODEL, PROMPT

pytestmark = pytest.mark.model


def test_completion_streamed_equals_non_streamed(openai_client: openai.OpenAI) -> None:
    whole = openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8)
    assert whole.object == "text_completion"
    assert whole.choices[0].text
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 8
    chunks = list(openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0,
                                                   max_tokens=8, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_usage_matches_tokenizer(openai_client: openai.OpenAI, engine_client: EngineClient) -> None:
    response = openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4)
    assert response.usage.prompt_tokens == len(engine_client.tokenize(PROMPT).token_ids)
    assert response.usage.total_tokens == response.usage.prompt_tokens + 4


def test_completion_include_usage(openai_client: openai.OpenAI) -> None:
    chunks = list(openai_client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5,
                                                   stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5


def test_list_models(openai_client: openai.OpenAI) -> None:
    models = openai_client.models.list().data
    assert [model.id for model in models] == [MODEL]
    assert models[0].object == "model"
    assert openai_client.models.retrieve(MODEL).id == MODEL


def test_retrieve_unknown_model_is_404(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-model")
