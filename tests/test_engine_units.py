"""Unit tests for the engine's text pieces: stop strings, incremental detokenization, sampling.

The detokenizer tests use the default model's tokenizer (converting the model on a first run), so
they are in the `model` tier; the rest need no model."""

from __future__ import annotations

import pytest
import torch

from engine_service.model.loader import DEFAULT_MODEL_ID, resolve_model
from engine_service.text.detokenizer import IncrementalDetokenizer, TokenTable
from engine_service.core.admission import Admission
from engine_service.core.params import InvalidRequest, RequestParams, SamplingParams, StoppingParams
from engine_service.core.sampler import sample
from engine_service.core.sequence import Request, Sequence
from engine_service.text.stop_strings import StopStringMatcher

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's real tokenizer."""
    from transformers import AutoTokenizer

    _, folder = resolve_model(DEFAULT_MODEL_ID)
    return AutoTokenizer.from_pretrained(folder)


def feed_all(matcher: StopStringMatcher, pieces: list[str]) -> tuple[str, str | None]:
    out = ""
    for piece in pieces:
        emitted, matched = matcher.feed(piece)
        out += emitted
        if matched:
            return out, matched
    return out + matcher.flush(), None


def test_stop_string_spanning_pieces_is_cut_and_never_emitted():
    text, matched = feed_all(StopStringMatcher(["END"]), ["abc E", "N", "D tail"])
    assert (text, matched) == ("abc ", "END")


def test_partial_stop_prefix_is_released_when_it_stops_matching():
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("abc EN") == ("abc ", None)  # "EN" held back
    assert matcher.feed("x") == ("ENx", None)


def test_earliest_of_several_stop_strings_wins():
    text, matched = feed_all(StopStringMatcher(["world", "lo w"]), ["hello ", "world"])
    assert (text, matched) == ("hel", "lo w")


@pytest.mark.model
@pytest.mark.parametrize("text", ["héllo wörld, naïve café", "日本語のテキスト 世界", "emoji 🎉🚀 mixed ✓ text", "  spaces   kept\n\tand tabs"])
def test_incremental_detokenizer_matches_full_decode(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=[1, 2, 3])
    pieces = [detok.add(i) for i in ids]
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.model
def test_token_table_gives_raw_bytes_of_partial_characters(tokenizer):
    ids = tokenizer("🎉", add_special_tokens=False)["input_ids"]
    table = TokenTable(tokenizer)
    assert b"".join(table.text_and_bytes(i)[1] for i in ids) == "🎉".encode()


def make_seq(**sampling) -> Sequence:
    """A sequence for the sampler, which reads its parameters and tokens but never makes text: no
    output processor, so no tokenizer and no model (were one used, these tests would fail on None)."""
    params = RequestParams(SamplingParams(**sampling), StoppingParams())
    request = Request("r", [1, 2, 3], params, max_tokens=10, sink=lambda events: None)
    return Sequence(request, 0, stop_ids={2}, matcher=None, output=None)


def test_sampler_greedy_top_k_one_and_logit_bias():
    logits = torch.randn(3, 100)
    greedy = make_seq(temperature=0.0)
    top1 = make_seq(temperature=1.0, top_k=1)
    biased = make_seq(temperature=0.0, logit_bias={7: 100.0})
    tokens, _ = sample(logits, [greedy, top1, biased])
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[1] == int(logits[1].argmax())
    assert tokens[2] == 7


def test_sampler_seed_gives_same_draws_whatever_the_batch():
    logits = torch.randn(4, 1000)
    alone = [sample(logits[1:2], [make_seq(temperature=1.0, seed=42)])[0][0] for _ in range(1)]
    seqs = [make_seq(temperature=1.0) for _ in range(4)]
    seqs[1] = make_seq(temperature=1.0, seed=42)
    batched, _ = sample(logits, seqs)
    assert batched[1] == alone[0]


def test_min_tokens_masks_eos():
    seq = make_seq(temperature=0.0)
    seq.params.stopping.min_tokens = 5
    logits = torch.zeros(1, 100)
    logits[0, 2] = 50.0  # EOS would win
    tokens, _ = sample(logits, [seq])
    assert tokens[0] != 2


def test_max_tokens_beyond_the_context_is_capped_and_only_an_oversized_prompt_refused():
    """An agent's default budget (Claude Code's 32000) on a short prompt runs, capped to the room the
    context leaves; a prompt that leaves no room for one token is refused."""
    admission = Admission(max_model_len=64, kv_capacity_tokens=1000, vocab_size=100, max_batch_size=4)

    def admitted(prompt_len: int, max_tokens: int | None) -> Request:
        params = RequestParams(SamplingParams(), StoppingParams(max_tokens=max_tokens))
        request = Request("r", [1] * prompt_len, params, max_tokens=0, sink=lambda events: None)
        admission.check(request)
        return request

    assert admitted(10, 32000).max_tokens == 54
    assert admitted(10, 20).max_tokens == 20
    assert admitted(10, None).max_tokens == 54
    assert admitted(63, 32000).max_tokens == 1
    with pytest.raises(InvalidRequest, match="maximum context length is 64 tokens") as refused:
        admitted(64, 1)
    assert (refused.value.param, refused.value.code) == ("input", "context_length_exceeded")


def test_params_validation_rejects_out_of_range():
    with pytest.raises(InvalidRequest, match="temperature"):
        RequestParams(SamplingParams(temperature=3.0), StoppingParams()).validate(100)
    with pytest.raises(InvalidRequest, match="top_logprobs"):
        RequestParams(SamplingParams(), StoppingParams(), logprobs=True, top_logprobs=21).validate(100)
    with pytest.raises(InvalidRequest, match="logit_bias"):
        RequestParams(SamplingParams(logit_bias={500: 1.0}), StoppingParams()).validate(100)
