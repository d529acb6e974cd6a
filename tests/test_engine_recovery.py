"""What a failed step does (core/recovery.py), on the real scheduler, request table and choices with
the default model's tokenizer, and no model: the request at fault fails alone, the others are
rewound (started over before their first token, recomputed after it) and suspected, and a suspect
that gets a token through is cleared. tests/test_hardening_engine_stack.py proves the same on a
real engine process with injected faults."""

from __future__ import annotations

import pytest

from engine_service.core.block_manager import BlockManager
from engine_service.core.choices import Choices
from engine_service.core.events import Event, FinalEvent, FinishReason, PromptEvent
from engine_service.core.metrics import StepRecorder
from engine_service.core.params import RequestParams, SamplingParams, StoppingParams
from engine_service.core.recovery import StepRecovery
from engine_service.core.requests import Requests
from engine_service.core.scheduler import ScheduledBatch, Scheduler
from engine_service.core.sequence import Request
from engine_service.model.loader import DEFAULT_MODEL_ID, resolve_model

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)

TOKEN = 7  # what every "sampled" token is here


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    _, folder = resolve_model(DEFAULT_MODEL_ID)
    return AutoTokenizer.from_pretrained(folder)


class Parts:
    """The engine's parts that a failed step touches, wired as the engine wires them."""

    def __init__(self, tokenizer) -> None:
        self.scheduler = Scheduler(BlockManager(64, 4, lambda src, dst: None), max_batch_size=8, max_step_tokens=64)
        self.requests = Requests(self.scheduler, StepRecorder(None))
        # No request here has a grammar, so no grammar compiler.
        self.choices = Choices(tokenizer, [0], None, self.scheduler, self.requests, StepRecorder(None))
        self.recovery = StepRecovery(self.scheduler, self.requests, self.choices)

    def submit(self, request_id: str, n: int = 1) -> Request:
        params = RequestParams(SamplingParams(), StoppingParams(max_tokens=50, ignore_eos=True), n=n)
        request = Request(request_id, [1, 2, 3, 4, 5], params, max_tokens=50, sink=lambda events: None)
        self.requests.add(request)
        self.scheduler.waiting.extend(self.choices.make(request))
        return request

    def good_step(self) -> list[str]:
        """A step that went through: what the engine's postprocess does, with TOKEN for every
        sample. Returns the ids of the requests it gave tokens to."""
        batch = self.scheduler.schedule()
        self.scheduler.advance(batch)
        sampled = []
        for seq in batch.sequences():
            if seq.num_cached == len(seq.token_ids):
                sampled += self.choices.start(seq) if seq.num_output == 0 and seq.index == 0 else [seq]
        for seq in sampled:
            seq.token_ids.append(TOKEN)
            seq.output.add(TOKEN, None)
        for request in {seq.request.request_id: seq.request for seq in sampled}.values():
            self.requests.send(request)
        self.recovery.passed(sampled)
        return sorted({seq.request.request_id for seq in sampled})

    def failed_step(self) -> ScheduledBatch:
        """A step whose run raised after the forward pass (as an injected fault does)."""
        batch = self.scheduler.schedule()
        try:
            raise RuntimeError("a failing step")
        except RuntimeError:
            self.recovery.failed(batch)
        return batch

    def told(self) -> dict[str, list[Event]]:
        told: dict[str, list[Event]] = {}
        for output in self.requests.take_outputs():
            told.setdefault(output.request.request_id, []).extend(output.events)
        return told


def test_a_failed_step_of_one_request_fails_that_request_alone(tokenizer) -> None:
    parts = Parts(tokenizer)
    a = parts.submit("a", n=2)
    parts.good_step()
    parts.told()
    parts.failed_step()
    finals = parts.told()["a"]
    assert [(e.index, e.finish_reason) for e in finals] == [(0, FinishReason.ERROR), (1, FinishReason.ERROR)]
    assert "a" not in parts.requests and not parts.scheduler.has_work()
    assert parts.scheduler.blocks.num_free == 64 and all(seq.block_table == [] for seq in a.sequences)
    assert parts.scheduler.suspects == set()


def test_a_failed_step_of_many_rewinds_and_suspects_them_all(tokenizer) -> None:
    parts = Parts(tokenizer)
    started = parts.submit("started", n=2)
    parts.good_step()
    parts.told()
    fresh = parts.submit("fresh")
    old_fresh = fresh.sequences[0]
    batch = parts.failed_step()
    assert {seq.request.request_id for seq in batch.sequences()} == {"started", "fresh"}
    assert parts.scheduler.suspects == {"started", "fresh"}
    assert parts.told() == {}, "nothing new to tell: no final, and the fresh one's PromptEvent is dropped"
    # Before its first token a request starts over, at the head of the line, with fresh sequences.
    assert fresh.sequences[0] is not old_fresh and fresh.outbox == []
    assert parts.scheduler.waiting[0] is fresh.sequences[0]
    # After it, its choices keep their tokens and are recomputed, as after a preemption.
    assert all(seq.num_cached == 0 and seq.output_ids == [TOKEN] for seq in started.sequences)
    assert all(seq in parts.scheduler.waiting for seq in started.sequences)
    # The suspects go one at a time; each that gets a token through is cleared.
    assert len(parts.good_step()) == 1
    assert len(parts.scheduler.suspects) == 1
    parts.good_step()
    assert parts.scheduler.suspects == set()
    told = parts.told()
    assert isinstance(told["fresh"][0], PromptEvent) and not any(isinstance(e, FinalEvent) for e in told["fresh"])


def test_a_failed_step_with_one_suspect_fails_the_suspect_and_rewinds_the_rest(tokenizer) -> None:
    parts = Parts(tokenizer)
    parts.submit("a")
    parts.submit("b")
    parts.good_step()
    parts.scheduler.suspects = {"a"}
    parts.told()
    parts.failed_step()
    told = parts.told()
    assert list(told) == ["a"] and told["a"][0].finish_reason is FinishReason.ERROR
    assert "b" in parts.requests and parts.scheduler.suspects == set()
    assert parts.good_step() == ["b"]


def test_a_failed_step_with_a_suspect_and_a_new_arrival_blames_neither(tokenizer) -> None:
    """The new arrival may be the one at fault: both are rewound and suspected, and the next steps
    hold one of them at a time."""
    parts = Parts(tokenizer)
    parts.submit("a")
    parts.submit("b")
    parts.good_step()
    parts.scheduler.suspects = {"a"}
    parts.submit("new")
    parts.told()
    parts.failed_step()
    finals = [event for events in parts.told().values() for event in events if isinstance(event, FinalEvent)]
    assert finals == []  # nobody failed
    assert all(request_id in parts.requests for request_id in ("a", "b", "new"))
    assert {"a", "new"} <= parts.scheduler.suspects
