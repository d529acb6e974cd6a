"""The compiled decode step (engine_service/model/compiled_step.py) computes what the eager step computes.

Two ModelRunners over copies of one tiny float32 Llama, one with its decode steps compiled, decode the same
sequences greedily side by side: one row alone (padded to the smallest bucket), two, three (padded to four),
draft rows, contexts growing past a block and past a power of two of blocks, then steps the compiled one must
leave to the eager forward (a prompt chunk beside decodes, more rows than its largest bucket). Every greedy
token must be the same and every logits row within float32 rounding of the eager one (inductor fuses the
elementwise ops, so not bit for bit). Both decode attentions: the native kernel reading the paged cache in
place (the CPU's) and the gathered SDPA one whose table width stays symbolic (the GPU's). Each compiles once
for the module (~10 s a bucket on 2 cores).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from conftest import torch_threads
from engine_service.core.config import EngineConfig, LoraConfig
from engine_service.core.engine import compile_decode
from engine_service.model.runner import ModelRunner
from engine_service.model.step import DecodeRow, PromptChunk, StepInput
from tiny_models import tiny_config, tiny_in_memory

pytestmark = [pytest.mark.in_process_engine, pytest.mark.model]

BLOCK = 16
CPU = torch.device("cpu")
MAX_ROWS = 4  # buckets [2, 4]: a lone row pads to 2 (float32's one-row GEMV rounds apart), three rows to 4


class Pair:
    """An eager runner and a compiled one over copies of the same model, fed the same steps."""

    def __init__(self, native_kernels: bool) -> None:
        model = tiny_in_memory(tiny_config(), torch.float32)
        self.eager = ModelRunner(copy.deepcopy(model), CPU, torch.float32, BLOCK, 64, 256,
                                 native_kernels=native_kernels)
        self.compiled = ModelRunner(model, CPU, torch.float32, BLOCK, 64, 256, native_kernels=native_kernels)
        self.outcome = self.compiled.compile_decode(MAX_ROWS)
        self.tokens: dict[int, list[int]] = {}  # seq_id -> prompt and greedy output so far
        self.tables: dict[int, list[int]] = {}

    def step(self, decode: dict[int, list[int]], prefill: dict[int, list[int]] = {}) -> None:
        """One step on both runners: `decode` seq_id -> its draft tokens, `prefill` seq_id -> a new prompt.
        Asserts the logits agree, then appends each decoded sequence's greedy token."""
        step = StepInput(
            decode=[DecodeRow(seq_id, self.tokens[seq_id][-1], len(self.tokens[seq_id]) - 1, self.tables[seq_id],
                              drafts) for seq_id, drafts in decode.items()],
            prefill=[PromptChunk(seq_id, prompt, 0, self.tables[seq_id], ends_prompt=True)
                     for seq_id, prompt in prefill.items()])
        want, got = self.eager.run(step), self.compiled.run(step)
        for seq_id in want.next_token:
            torch.testing.assert_close(got.next_token[seq_id], want.next_token[seq_id], rtol=1e-4, atol=1e-4)
            assert int(got.next_token[seq_id].argmax()) == int(want.next_token[seq_id].argmax()), f"sequence {seq_id}"
        for seq_id in want.drafts:
            torch.testing.assert_close(got.drafts[seq_id], want.drafts[seq_id], rtol=1e-4, atol=1e-4)
        for seq_id in decode:
            self.tokens[seq_id].append(int(want.next_token[seq_id].argmax()))
        for seq_id in prefill:
            self.tokens[seq_id] = [*prefill[seq_id], int(want.next_token[seq_id].argmax())]

    def start(self, seq_id: int, length: int) -> None:
        prompt = torch.randint(3, 512, (length,), generator=torch.Generator().manual_seed(seq_id)).tolist()
        self.tables[seq_id] = [4 * seq_id + i for i in range(4)]  # 64 tokens of room each
        self.step({}, {seq_id: prompt})


@pytest.fixture(scope="module", params=[True, False], ids=["native attention in place", "gathered attention"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    with torch_threads(1):  # as the tests run (conftest.py): a compiled graph is built for a thread count
        built = Pair(native_kernels=request.param)
    yield built


def test_compiled_decode_steps_match_the_eager_ones(pair: Pair) -> None:
    assert pair.outcome.startswith("compiled for [2, 4] rows"), pair.outcome
    assert (pair.compiled.decode_attention is not None) == (pair.eager.decode_attention is not None)
    pair.start(0, 13)
    for _ in range(5):
        pair.step({0: []})  # one row, padded to two
    pair.start(1, 7)
    pair.start(2, 30)
    for _ in range(3):
        pair.step({0: [], 1: []})
    for _ in range(14):  # three rows, padded to four; sequence 0 passes 32 tokens (past 2 blocks: a wider table)
        pair.step({0: [], 1: [], 2: []})
    pair.step({1: pair.tokens[1][-3:]})  # a row and three drafts: four rows
    pair.step({0: pair.tokens[0][-1:], 2: pair.tokens[2][-1:]})  # two rows and a draft each
    assert pair.compiled.compiled.steps == 24
    pair.start(3, 5)  # alone: eager, the same as the other runner
    pair.tables[4] = [16, 17, 18, 19]
    pair.step({0: [], 1: [], 2: []}, {4: [5, 6, 7]})  # with a prompt chunk: eager
    pair.step({0: [], 1: [], 2: [], 3: [], 4: []})  # five rows: past the largest bucket, eager
    assert pair.compiled.compiled.steps == 24
    assert len(pair.tokens[0]) > 2 * BLOCK and len(pair.tokens[2]) > 2 * BLOCK  # tables of 3 blocks: width 4


def test_a_compiler_failure_leaves_the_steps_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_service.model import compiled_step

    def refuse(self: compiled_step.CompiledDecode) -> float:
        raise RuntimeError("inductor cannot lower this\nsecond line")

    monkeypatch.setattr(compiled_step.CompiledDecode, "warm_up", refuse)
    runner = ModelRunner(tiny_in_memory(tiny_config(), torch.float32), CPU, torch.float32, BLOCK, 8, 256)
    outcome = runner.compile_decode(MAX_ROWS)
    assert outcome == "off, eager: the compiler failed (RuntimeError: inductor cannot lower this)"
    assert runner.compiled is None


@pytest.mark.parametrize(("config", "device", "outcome"), [
    (EngineConfig(), "cpu", "off (--compiled-step auto: on GPUs only)"),
    (EngineConfig(compiled_step="off"), "cuda", "off"),
    (EngineConfig(compiled_step="on", deterministic=True), "cpu", "off (--deterministic"),
    (EngineConfig(compiled_step="on", lora=LoraConfig()), "cpu", "off (--enable-lora"),
])
def test_what_rules_the_compiled_step_out(config: EngineConfig, device: str, outcome: str) -> None:
    assert compile_decode(None, config, torch.device(device)).startswith(outcome)
