"""Cores shared by demand (engine_service/core/core_share.py): the embedding engine marks the shared
file while it has work, and a chat engine runs its steps on its share of the threads while the mark lies
ahead, on all of them otherwise. Each side is read through a mapping of its own, as the other process's."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from conftest import torch_threads
from engine_service.core import core_share
from engine_service.core.config import EngineConfig
from engine_service.core.core_share import CoreShare, YieldingThreads
from engine_service.core.embedding_engine import EmbeddingEngine, EmbedJob
from engine_service.core.events import FinishReason

pytestmark = pytest.mark.in_process_engine


class WatchedModel:
    """Embeds an input as [its length]; records what another process reading the file sees meanwhile."""

    tokenizer = None
    vocab_size = 1000
    max_context_length = 512

    def __init__(self, reader: CoreShare) -> None:
        self.reader = reader
        self.seen: list[float] = []

    def embed(self, inputs: list[list[int]]) -> torch.Tensor:
        self.seen.append(self.reader.busy_until() - time.monotonic())
        return torch.tensor([[float(len(ids))] for ids in inputs])


def test_the_embedding_engine_marks_the_file_while_it_has_work_and_clears_it_when_it_ends(tmp_path) -> None:
    path = tmp_path / "core-share"
    reader = CoreShare(path)  # the chat engine's side (created here: the engine maps the same file)
    assert not reader.marked() and reader.busy_until() == 0.0
    model = WatchedModel(reader)
    engine = EmbeddingEngine(model, EngineConfig(max_batch_size=1))  # type: ignore[arg-type]
    engine.core_share = CoreShare(path)
    got: dict[str, FinishReason] = {}
    for name in ("a", "b"):
        engine.submit(EmbedJob(name, [[1, 2, 3]], lambda _vectors, reason, name=name: got.__setitem__(name, reason)))
    loop = threading.Thread(target=engine.run)
    loop.start()
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == {"a": FinishReason.STOP, "b": FinishReason.STOP}
    # During each forward the mark lay a lease ahead (further than the linger)...
    assert len(model.seen) == 2 and all(ahead > core_share.LINGER_S for ahead in model.seen)
    # ...and once the work ran out, at most the linger: the chat engine takes its threads back after it.
    while reader.busy_until() - time.monotonic() > core_share.LINGER_S and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reader.busy_until() - time.monotonic() <= core_share.LINGER_S
    engine.stop()
    loop.join(timeout=30)
    assert reader.busy_until() == 0.0  # a stopped engine leaves no mark


def test_a_chat_engine_steps_on_its_share_while_the_mark_lies_ahead_and_on_all_its_threads_otherwise(tmp_path):
    path = tmp_path / "core-share"
    marker = CoreShare(path)  # the embedding engine's side

    class Gauge:
        value = 0.0

        def set(self, value: float) -> None:
            self.value = value

    gauge = Gauge()
    with torch_threads(3):
        yielding = YieldingThreads(CoreShare(path), threads=3, shared_threads=2, gauge=gauge)  # type: ignore[arg-type]
        assert gauge.value == 3
        yielding.before_step()
        assert torch.get_num_threads() == 3 and gauge.value == 3  # no mark: every thread
        marker.working()
        yielding.before_step()
        assert torch.get_num_threads() == 2 and gauge.value == 2  # the embedding engine works: its share
        marker.idle()
        yielding.before_step()
        assert torch.get_num_threads() == 2  # within the linger, still the share
        marker.mark(time.monotonic() - 1)  # the linger is over
        yielding.before_step()
        assert torch.get_num_threads() == 3 and gauge.value == 3


def test_a_short_or_missing_file_is_made_whole_and_starts_unmarked(tmp_path) -> None:
    path = tmp_path / "core-share"
    path.write_bytes(b"")
    assert CoreShare(path).busy_until() == 0.0 and path.stat().st_size == core_share.MARK.size
    assert not CoreShare(tmp_path / "new").marked()
