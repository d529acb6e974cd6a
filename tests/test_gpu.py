"""The engine on a CUDA GPU (`make gpu-check` runs this with the stack tests; skipped without a GPU):
greedy tokens equal transformers' own on the same device and weights (float32, full-precision
weights), each prompt alone and in a batch; the compiled step (CUDA graphs) equals the eager one; in bfloat16 a prompt decodes the same alone and in a
full batch up to its first near-tie; a warm prompt is served from the prefix cache with the same
tokens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine_service.core.config import EngineConfig
from engine_service.core.engine import Engine, build_engine
from engine_service.core.events import PromptEvent
from engine_service.model.loader import load_model, resolve_model
from test_model_families import NEW_TOKENS, SHORT_TEXT, Completion, engine_greedy, long_text, random_prompts

pytestmark = [pytest.mark.model, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")]

# float32 on both sides, different attention kernels: a wrong mask or cache moves logprobs by nats.
LOGPROB_TOLERANCE = 1e-3


@contextmanager
def cuda_engine(dtype: str, compiled_step: str = "auto") -> Iterator[Engine]:
    """The default model's engine on the GPU; its decode step compiled (CUDA graphs) unless compiled_step="off"."""
    engine = build_engine(load_model(None, device="cuda", dtype=dtype),
                          EngineConfig(quantization="none", kv_cache_gb=1.0, max_batch_size=16,
                                       compiled_step=compiled_step))
    engine.loop.start()
    try:
        yield engine
    finally:
        engine.loop.stop()


def prompts(engine: Engine) -> list[list[int]]:
    return [engine.tokenizer(text)["input_ids"] for text in (SHORT_TEXT, long_text(12))]


def test_greedy_tokens_match_transformers_on_the_same_gpu() -> None:
    reference = AutoModelForCausalLM.from_pretrained(resolve_model(None)[1], dtype=torch.float32).to("cuda")
    with cuda_engine("float32") as engine:
        wanted = []
        for prompt in prompts(engine):
            out = reference.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW_TOKENS,
                                     do_sample=False, eos_token_id=None, output_logits=True,
                                     return_dict_in_generate=True)
            ids = out.sequences[0, len(prompt):].tolist()
            wanted.append((ids, [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, ids)]))
        alone = [engine_greedy(engine, [p])[0] for p in prompts(engine)]
        batched = engine_greedy(engine, prompts(engine) + random_prompts(5, 40, 300))[:2]
        for label, got in (("alone", alone), ("in a batch", batched)):
            for (ids, logprobs), have in zip(wanted, got):
                assert have.ids == ids, label
                assert have.logprobs == pytest.approx(logprobs, abs=LOGPROB_TOLERANCE), label


def test_the_compiled_step_decodes_as_the_eager_one() -> None:
    """float32: CUDA graphs of the compiled step against the eager forward, alone and in a batch of 7."""
    runs = []
    for compiled_step in ("on", "off"):
        with cuda_engine("float32", compiled_step) as engine:
            assert (engine.core.runner.compiled is not None) == (compiled_step == "on")
            batch = prompts(engine) + random_prompts(5, 40, 300)
            runs.append(([engine_greedy(engine, [p])[0] for p in prompts(engine)], engine_greedy(engine, batch)))
            if compiled_step == "on":
                assert engine.core.runner.compiled.steps > 0
    (alone, batched), (eager_alone, eager_batched) = runs
    assert [c.ids for c in alone] == [c.ids for c in eager_alone]
    assert [c.ids for c in batched] == [c.ids for c in eager_batched]
    for got, want in zip(alone + batched, eager_alone + eager_batched):
        assert got.logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOLERANCE)


def test_bfloat16_decodes_the_same_alone_and_in_a_full_batch() -> None:
    with cuda_engine("bfloat16") as engine:
        prompt = prompts(engine)[1]
        alone = engine_greedy(engine, [prompt])[0]
        batched = engine_greedy(engine, [prompt] + random_prompts(*range(20, 300, 20)))[0]
    assert batched.ids[:4] == alone.ids[:4], "the first tokens of a long greedy prompt have no near-tie here"


class CachedTokens(Completion):
    cached: int = 0

    def __call__(self, events) -> None:
        self.cached += sum(e.cached_tokens for e in events if isinstance(e, PromptEvent))
        super().__call__(events)


def test_a_warm_prompt_comes_from_the_prefix_cache_with_the_same_tokens() -> None:
    from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
    from engine_service.core.sequence import Request

    with cuda_engine("bfloat16") as engine:
        prompt = prompts(engine)[1]
        runs = []
        for i in range(2):
            sink = CachedTokens()
            params = RequestParams(SamplingParams(temperature=0.0), StoppingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
            engine.submit(Request(f"warm-{i}", list(prompt), params, max_tokens=0, sink=sink))
            assert sink.done.wait(120)
            runs.append(sink)
    cold, warm = runs
    assert cold.cached == 0 and warm.cached >= len(prompt) - engine.config.block_size
    assert warm.ids == cold.ids
