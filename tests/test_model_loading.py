"""Fast checks of model loading and attention layout that need no model: where a GGUF's conversion is
cached, and the sliding-window mask against transformers' own definition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine_service.model.attention import causal_mask
from engine_service.model.loader import gguf_cache_folder, resolve_model

pytestmark = pytest.mark.in_process_engine  # engine code in this process (conftest.py)


def test_a_changed_gguf_file_gets_a_new_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CONDUIT_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny-model.gguf"
    gguf.write_bytes(b"GGUF one")
    first = gguf_cache_folder(gguf)
    assert first.parent == tmp_path / "cache" / "models" / "gguf" and first.name.startswith("tiny-model-")
    assert gguf_cache_folder(gguf) == first
    gguf.write_bytes(b"GGUF two")  # same size: the mtime tells
    os.utime(gguf, ns=(gguf.stat().st_atime_ns, gguf.stat().st_mtime_ns + 1_000_000))
    assert gguf_cache_folder(gguf) != first


def test_a_missing_gguf_file_is_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no GGUF file at .*absent.gguf"):
        resolve_model(str(tmp_path / "absent.gguf"))


@pytest.mark.parametrize("window", [None, 1, 3, 16])
def test_sliding_window_mask_is_transformers_own(window: int | None):
    """Queries from position 5 (a chunk after cached context) over keys from position 2 (blocks before
    the window skipped): the same mask as transformers' causal mask with its sliding-window overlay."""
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    queries, keys = torch.arange(5, 12), torch.arange(2, 12)
    rule = causal_mask_function if window is None else and_masks(causal_mask_function,
                                                                  sliding_window_overlay(window))
    want = rule(0, 0, queries[:, None], keys[None, :])
    assert torch.equal(causal_mask(queries, keys, window), want)
