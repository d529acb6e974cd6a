"""A step that gives way (model/step.py's StepGaveWay: a batch step an interactive request arrived
during, core/engine_core.py) leaves nothing behind: run again later, after the interactive step, it
gives the logits of a step that never stopped, and the interactive step's are unchanged by it. On a
tiny random Llama through the lean forward and through transformers' own (the check is in the paged
attention, which both call once a layer)."""

from __future__ import annotations

import copy

import pytest
import torch

from engine_service.core.inbox import Inbox
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.scheduler import ScheduledBatch
from engine_service.core.sequence import Request
from engine_service.model.runner import ModelRunner
from engine_service.model.step import StepGaveWay
from tiny_models import RunnerSeq, tiny_config, tiny_in_memory

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

BLOCK = 16
CPU = torch.device("cpu")


def give_way_at(layer: int):
    """A give_way that says yes at the `layer`-th time it is asked (one ask per layer)."""
    asked = []

    def give_way() -> bool:
        asked.append(1)
        return len(asked) > layer
    return give_way


def steps(vocab: int) -> tuple[ScheduledBatch, ScheduledBatch, ScheduledBatch]:
    """Two batch prompts prefilled, then their decodes beside a prompt chunk (the step that gives way),
    and an interactive prompt in blocks of its own."""
    g = torch.Generator().manual_seed(1)
    prompt = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    a, b = RunnerSeq(0, prompt(20), block_table=[0, 1]), RunnerSeq(1, prompt(9), block_table=[2])
    first = ScheduledBatch(prefill=[(a, 20), (b, 9)])
    c = RunnerSeq(2, prompt(30), block_table=[3, 4])
    live = ScheduledBatch(prefill=[(RunnerSeq(3, prompt(12), block_table=[5]), 12)])
    return first, ScheduledBatch(decode=[a, b], prefill=[(c, 30)]), live


def advance(batch: ScheduledBatch) -> None:
    for seq in batch.decode:
        seq.num_cached += 1
    for seq, length in batch.prefill:
        seq.num_cached += length
    for seq in batch.sequences():
        seq.token_ids.append(5)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_a_step_that_gave_way_reruns_to_the_logits_of_one_that_did_not(lean: bool) -> None:
    config = tiny_config()
    model = tiny_in_memory(config, torch.float32)
    runners = [ModelRunner(m, CPU, torch.float32, BLOCK, 16, 256, lean_forward=lean, deterministic=True)
               for m in (model, copy.deepcopy(model))]
    results = []
    for gives_way, runner in zip([True, False], runners):
        first, batch_step, live = steps(config.vocab_size)
        runner.run(first.step_input())
        advance(first)
        if gives_way:
            with pytest.raises(StepGaveWay):
                runner.run(batch_step.step_input(), give_way_at(1))  # layer 0 wrote the batch's keys
        live_logits = runner.run(live.step_input(), give_way_at(99))  # asked, never yes: runs whole
        results.append((runner.run(batch_step.step_input()).next_token, live_logits.next_token))
    (rerun, live_after), (whole, live_alone) = results
    assert rerun.keys() == whole.keys() == {0, 1, 2}
    for seq_id in whole:
        assert torch.equal(rerun[seq_id], whole[seq_id]), f"sequence {seq_id}"
    assert torch.equal(live_after[3], live_alone[3])


def request(batch: bool) -> Request:
    params = RequestParams(SamplingParams(), StoppingParams(max_tokens=4))
    return Request("r", [1, 2, 3], params, max_tokens=4, sink=lambda events: None, batch=batch)


def test_the_inbox_says_when_an_interactive_request_waits_and_not_for_batch_work() -> None:
    inbox = Inbox(max_waiting=8)
    inbox.put(request(batch=True), waiting=0, free_slots=8, admit=lambda: None)
    assert not inbox.interactive_waiting(), "batch work does not stop a batch step"
    inbox.put(request(batch=False), waiting=0, free_slots=8, admit=lambda: None)
    assert inbox.interactive_waiting()
    inbox.take()
    assert not inbox.interactive_waiting(), "taken: the next step is the interactive one's"
