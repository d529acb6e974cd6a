"""LoRA adapters (model/lora.py, core/adapters.py): PEFT folders written here with safetensors alone,
checked at load; a step mixing the base model and two adapters computes each row as it would alone,
and as transformers does with the adapter merged into the weights (W + scale * B @ A)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from lora_files import merged, scale_of, write_adapter
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

from engine_service.core.adapters import Adapters
from engine_service.core.config import LoraConfig, LoraModule
from engine_service.core.scheduler import ScheduledBatch
from engine_service.model.lora import AdapterError, read_adapter
from engine_service.model.runner import ModelRunner, adapter_runs

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

CPU = torch.device("cpu")
# Two adapters of different ranks over different modules (the fused q/k/v and gate/up included).
ADAPTERS = {1: (("q_proj", "v_proj", "down_proj"), 4, 8.0, False), 2: (("k_proj", "o_proj", "gate_proj", "up_proj"), 8, 4.0, True)}
PROMPTS = {0: list(range(3, 40)), 1: list(range(50, 71)), 2: list(range(100, 133))}


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return tiny_in_memory(tiny_config(), torch.float32)


@pytest.fixture(scope="module")
def folders(base: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("adapters")
    return {slot: (root / f"a{slot}", write_adapter(root / f"a{slot}", base, targets, rank, alpha, seed=slot,
                                                     rslora=rslora))
            for slot, (targets, rank, alpha, rslora) in ADAPTERS.items()}


def serving(base: torch.nn.Module, folders: dict, quantization: str = "none", lean: bool = True,
            deterministic: bool = False) -> ModelRunner:
    runner = ModelRunner(copy.deepcopy(base), CPU, torch.float32, 16, 40, 256, quantization=quantization,
                         lean_forward=lean, deterministic=deterministic)
    for slot, (folder, _) in folders.items():
        runner.load_adapter(slot, read_adapter(folder, runner.linear_shapes, 64))
    return runner


def next_token_logits(runner: ModelRunner, slots: list[int], decode_token: int | None = None
                      ) -> dict[int, torch.Tensor]:
    """Each slot's prompt prefilled in one step together (blocks apart); its next token's logits. With
    `decode_token`: that token then decoded by all of them in one step; the logits after it."""
    seqs = [RunnerSeq(slot, PROMPTS[slot], block_table=[3 * i, 3 * i + 1, 3 * i + 2]) for i, slot in enumerate(slots)]
    for seq, slot in zip(seqs, slots):
        seq.request.adapter_slot = slot
    logits = runner.run(ScheduledBatch(prefill=[(seq, len(seq.token_ids)) for seq in seqs]).step_input())
    if decode_token is not None:
        for seq in seqs:
            seq.token_ids = [*seq.token_ids, decode_token]
            seq.num_cached = len(seq.token_ids) - 1
        logits = runner.run(ScheduledBatch(decode=seqs).step_input())
    return {slot: logits.next_token[slot] for slot in slots}


def reference_logprobs(base: torch.nn.Module, folders: dict, slot: int, ids: list[int]) -> torch.Tensor:
    """transformers' next-token logprobs after `ids`, the slot's adapter merged into the weights (0: none)."""
    model = base
    if slot:
        targets, rank, alpha, rslora = ADAPTERS[slot]
        model = merged(base, folders[slot][1], scale_of(rank, alpha, rslora))
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1)


@pytest.mark.parametrize("lean", [True, False], ids=["lean forward", "transformers forward"])
def test_each_adapter_computes_what_transformers_does_with_it_merged(base, folders, lean: bool) -> None:
    runner = serving(base, folders, lean=lean)
    together = next_token_logits(runner, [0, 1, 2])
    for slot, prompt in PROMPTS.items():
        want = reference_logprobs(base, folders, slot, prompt)
        got = torch.log_softmax(together[slot], dim=-1)
        assert (got - want).abs().max() < 1e-4, slot
        if slot:
            with torch.no_grad():
                plain = torch.log_softmax(base(torch.tensor([prompt])).logits[0, -1], dim=-1)
            assert (want - plain).abs().max() > 0.5, "the adapter changes the answer"


@pytest.mark.parametrize("slots", [[2, 0, 1], [1, 2, 0, 1, 1]], ids=["as many rows each", "padded"])
def test_decode_rows_of_several_adapters_in_one_batched_pair_compute_what_each_merged_adapter_does(
        base, folders, slots: list[int]):
    """Decode rows of two adapters and the base model: the stacked path (linear.py's StackedRuns), its
    rows in order (one each) or gathered and padded (adapter 1 has three, adapter 2 one)."""
    runner = serving(base, folders)
    prompts = [PROMPTS[slot][k:] for k, slot in enumerate(slots)]  # a prompt of its own each
    seqs = [RunnerSeq(k, prompt, block_table=[3 * k, 3 * k + 1, 3 * k + 2]) for k, prompt in enumerate(prompts)]
    for seq, slot in zip(seqs, slots):
        seq.request.adapter_slot = slot
    runner.run(ScheduledBatch(prefill=[(seq, len(seq.token_ids)) for seq in seqs]).step_input())
    for seq in seqs:
        seq.token_ids = [*seq.token_ids, 7]
        seq.num_cached = len(seq.token_ids) - 1
    logits = runner.run(ScheduledBatch(decode=seqs).step_input())
    stacked = runner.rows.stacked_runs
    assert stacked is not None and stacked.slots == (1, 2)
    assert (stacked.first is None) == (len(slots) == 5), "in order without padding, else gathered"
    for seq, slot in zip(seqs, slots):
        want = reference_logprobs(base, folders, slot, seq.token_ids)
        assert (torch.log_softmax(logits.next_token[seq.seq_id], dim=-1) - want).abs().max() < 1e-4, seq.seq_id


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_a_row_gets_the_same_bits_alone_and_beside_other_adapters(base, folders, quantization: str) -> None:
    runner = serving(base, folders, quantization)
    together = next_token_logits(runner, [2, 0, 1])
    for slot in PROMPTS:
        assert torch.equal(next_token_logits(runner, [slot])[slot], together[slot]), slot


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_with_deterministic_a_decode_row_gets_the_same_bits_alone_and_beside_other_adapters(base, folders,
                                                                                            quantization: str):
    """--deterministic: decode rows of several adapters keep a low-rank pair per run (no batched pair)."""
    runner = serving(base, folders, quantization, deterministic=True)
    together = next_token_logits(runner, [2, 0, 1], decode_token=7)
    assert runner.rows.stacked_runs is None
    for slot in PROMPTS:
        assert torch.equal(next_token_logits(runner, [slot], decode_token=7)[slot], together[slot]), slot


def test_an_unloaded_adapter_leaves_the_base_model_as_it_was(base, folders) -> None:
    runner = serving(base, folders)
    before = next_token_logits(runner, [0])[0]
    runner.unload_adapter(1)
    runner.unload_adapter(2)
    assert all(not getattr(m, "lora", None) for m in runner.model.modules())
    assert torch.equal(next_token_logits(runner, [0])[0], before)


def test_adapters_beyond_max_loras_wait_on_the_host_and_take_the_slot_of_the_least_recent_unheld(base, folders) -> None:
    """--max-loras 1, --max-cpu-loras 2: both adapters load; one is resident at a time; a held one is never
    evicted (its request waits); the one brought in computes in the other's slot what it computes in its own."""
    runner = ModelRunner(copy.deepcopy(base), CPU, torch.float32, 16, 40, 256, quantization="none")
    adapters = Adapters(runner, LoraConfig(max_loras=1, max_cpu_loras=2), "tiny")
    one, two = (adapters.load(LoraModule(name, str(folders[slot][0]))) for name, slot in (("one", 1), ("two", 2)))
    with pytest.raises(AdapterError, match="2 adapters are loaded already"):
        adapters.load(LoraModule("three", str(folders[1][0])))
    assert (one.slot, two.slot) == (0, 0)  # loaded, not resident
    assert adapters.resident(one, set()) and one.slot == 1
    assert not adapters.resident(two, {one}) and two.slot == 0  # the slot is held: two's request waits
    assert adapters.resident(two, set()) and (one.slot, two.slot) == (0, 1)
    seq = RunnerSeq(0, PROMPTS[2], block_table=[0, 1, 2])
    seq.request.adapter_slot = two.slot
    got = runner.run(ScheduledBatch(prefill=[(seq, len(seq.token_ids))]).step_input()).next_token[0]
    assert torch.equal(got, next_token_logits(serving(base, folders), [2])[2])


def test_runs_of_one_adapter_are_cut_at_the_groups() -> None:
    assert adapter_runs([0, 1, 1, 2, 0, 2, 2, 2], [3, 8]) == [(1, 3, 1), (3, 4, 2), (5, 8, 2)]
    assert adapter_runs([1, 1, 1, 1], [2, 4]) == [(0, 2, 1), (2, 4, 1)]
    assert adapter_runs([0, 0], [2]) == []


def config(folder: Path, **fields) -> None:
    import json

    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("fields, error", [
    ({"use_dora": True}, "use_dora: DoRA adapters are not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias 'all'"),
    ({"target_modules": ["q_proj", "lm_head"]}, "target_modules 'lm_head'"),
    ({"r": 4, "rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
])
def test_what_the_engine_does_not_compute_is_refused_naming_the_field(base, tmp_path, fields, error) -> None:
    write_adapter(tmp_path, base, ("q_proj",), 4, 8.0, seed=0)
    config(tmp_path, **fields)
    with pytest.raises(AdapterError, match=error):
        read_adapter(tmp_path, {}, 64)


def test_an_adapter_for_another_model_or_rank_is_refused(base, tmp_path) -> None:
    write_adapter(tmp_path / "ok", base, ("q_proj",), 16, 8.0, seed=0)
    shapes = {name: (m.out_features, m.in_features) for name, m in base.named_modules()
              if isinstance(m, torch.nn.Linear)}
    with pytest.raises(AdapterError, match="r=16 is above --max-lora-rank 8"):
        read_adapter(tmp_path / "ok", shapes, 8)
    wider = {name: (out * 2, inputs) for name, (out, inputs) in shapes.items()}
    with pytest.raises(AdapterError, match="an adapter for another base model"):
        read_adapter(tmp_path / "ok", wider, 64)
    with pytest.raises(AdapterError, match="needs adapter_config.json and adapter_model.safetensors"):
        read_adapter(tmp_path, shapes, 64)


@pytest.mark.parametrize("text, module", [
    ("sql=/adapters/sql", LoraModule("sql", "/adapters/sql")),
    ('{"name": "sql", "path": "/a/sql", "base_model_name": "m"}', LoraModule("sql", "/a/sql", "m")),
])
def test_lora_modules_take_vllms_forms(text: str, module: LoraModule) -> None:
    assert LoraModule.parse(text) == module


@pytest.mark.parametrize("text", ["sql", "=/x", '{"name": "sql"}', '{"name": "a", "path": "/b", "rank": 4}'])
def test_a_bad_lora_module_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--lora-modules"):
        LoraModule.parse(text)
