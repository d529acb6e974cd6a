"""LoRA adapters on a real stack, the default model in float32 with two adapters written here (ranks 4
and 8, different modules): the openai SDK finds them in /v1/models with their base as parent, picks
them by `model`, and gets transformers' greedy tokens with the adapter merged; requests over the base
model and both adapters get alone what they get together; and a prompt the base model answered is not
served from its cache to an adapter."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
from conftest import STARTUP_TIMEOUT_S, torch_threads
from lora_files import merged, scale_of, write_adapter

import goldens
from common import MODEL
from engine_service.model.loader import load_model
from launcher.stack import Stack

pytestmark = pytest.mark.model

ADAPTERS = {"alpha": (("q_proj", "v_proj"), 4, 8.0), "beta": (("o_proj", "gate_proj", "down_proj"), 8, 8.0)}
QUESTIONS = ["What is the capital of France?", "Name a color.", "Count to three."]
TOKENS = 12


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[list[tuple[str, float]]]]]:
    """The adapters' folder, and transformers' greedy answer to each question by each model (merged), as
    (token text, logprob) up to its first near-tie (goldens.NEAR_TIE: there any CPU may go either way)."""
    with torch_threads(1):  # small ops beside the other worker: two threads wait on each other (conftest.py)
        return _references(tmp_path_factory.mktemp("adapters"))


def _references(folder: Path) -> tuple[Path, dict[str, list[list[tuple[str, float]]]]]:
    loaded = load_model(None, device="cpu", dtype="float32")
    tokenizer = loaded.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             return_dict=False) for q in QUESTIONS]
    references = {MODEL: loaded.model}
    for index, (name, (targets, rank, alpha)) in enumerate(ADAPTERS.items()):
        pairs = write_adapter(folder / name, loaded.model, targets, rank, alpha, seed=index + 1, magnitude=0.05)
        references[name] = merged(loaded.model, pairs, scale_of(rank, alpha))
    tokens = {}
    with torch.no_grad():
        for name, model in references.items():
            tokens[name] = []
            for prompt in prompts:  # greedy by hand over transformers' own KV cache
                ids, past, answer = torch.tensor([prompt]), None, []
                for _ in range(TOKENS):
                    out = model(input_ids=ids, past_key_values=past, use_cache=True)
                    logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                    top = torch.topk(logprobs, 2)
                    if top.values[0] - top.values[1] < goldens.NEAR_TIE:
                        break
                    token = int(top.indices[0])
                    answer.append((tokenizer.decode([token]), float(logprobs[token])))
                    ids, past = torch.tensor([[token]]), out.past_key_values
                tokens[name].append(answer)
    del references, loaded
    gc.collect()
    return folder, tokens


@pytest.fixture(scope="module")
def client(expected) -> Iterator[openai.OpenAI]:
    folder, _ = expected
    args = ["--dtype", "float32", "--quantization", "none", "--deterministic", "--enable-lora",
            "--lora-modules", *(f"{name}={folder / name}" for name in ADAPTERS)]
    with Stack(engine_args=args, startup_timeout=STARTUP_TIMEOUT_S) as stack, \
            openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=180) as sdk:
        yield sdk


def greedy_logprobs(client: openai.OpenAI, model: str, question: str) -> list[tuple[str, float]]:
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=TOKENS, temperature=0,
        logprobs=True, extra_body={"ignore_eos": True})
    return [(entry.token, entry.logprob) for entry in response.choices[0].logprobs.content]


def greedy(client: openai.OpenAI, model: str, question: str, system: str | None = None) -> tuple[str, int]:
    """The greedy answer and its prompt's cached tokens."""
    messages = [{"role": "system", "content": system}] * bool(system) + [{"role": "user", "content": question}]
    response = client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS, temperature=0,
                                              extra_body={"ignore_eos": True})
    return response.choices[0].message.content, response.usage.prompt_tokens_details.cached_tokens


def test_adapters_are_listed_with_their_base_as_parent(client: openai.OpenAI, expected) -> None:
    folder, _ = expected
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL, *ADAPTERS}
    assert models[MODEL].model_extra["parent"] is None
    for name in ADAPTERS:
        assert models[name].model_extra["parent"] == MODEL
        assert models[name].model_extra["root"] == str(folder / name)


def test_each_model_answers_as_transformers_does_with_the_adapter_merged(client: openai.OpenAI, expected) -> None:
    _, tokens = expected
    for name in (MODEL, *ADAPTERS):
        for question, want in zip(QUESTIONS, tokens[name]):
            got = greedy_logprobs(client, name, question)[:len(want)]
            assert [token for token, _ in got] == [token for token, _ in want], (name, question)
            diffs = [abs(a - b) for (_, a), (_, b) in zip(got, want)]
            assert max(diffs, default=0.0) < 1e-4, (name, question, diffs)
    assert sum(len(answer) for name in ADAPTERS for answer in tokens[name]) >= 2 * TOKENS, "answers compared"
    assert tokens["alpha"] != tokens[MODEL] and tokens["beta"] != tokens[MODEL], "the adapters change the answers"


def test_requests_over_the_base_and_both_adapters_get_alone_what_they_get_together(client: openai.OpenAI) -> None:
    jobs = [(model, question) for model in (MODEL, *ADAPTERS) for question in QUESTIONS] + [(MODEL, "Hi.")] * 3
    alone = [greedy(client, *job)[0] for job in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: greedy(client, *job)[0], jobs))
    assert together == alone


def test_an_adapter_never_reads_the_base_models_cache(client: openai.OpenAI) -> None:
    # Past the first 64-token prompt segment: prefix-cache hits end on segment boundaries (model/step.py).
    rules = " ".join(f"Rule {i}: keep answers short and plain." for i in range(8))
    system, question = f"Conversation {uuid.uuid4().hex}: answer briefly. {rules}", "Describe the moon in one sentence."
    greedy(client, MODEL, question, system)
    assert greedy(client, MODEL, question, system)[1] > 0, "the base model's prompt is cached"
    assert greedy(client, "alpha", question, system)[1] == 0, "not for the adapter"
    assert greedy(client, "alpha", question, system)[1] > 0, "the adapter's own prompt is"
