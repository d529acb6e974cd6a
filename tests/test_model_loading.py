"""Model loading and attention layout: where a GGUF's conversion is cached, two processes converting
the same GGUF at once, and the sliding-window mask against transformers' own definition."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_service.model.attention import causal_mask
from launcher.stack import REPO_ROOT
from conduit_common.lifetime import child_env
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


# A converter process whose saves wait until both converters have reached theirs (a barrier of files in
# sys.argv[1]): their writes then overlap every time, as two replicas' may on a first start. What it
# converts is a tiny random Llama with a one-word tokenizer in place of the GGUF's (dequantizing the
# real one costs ~20 s a process): the race is in where the folder is written, not in what is in it.
CONVERTER = """
import os, sys, time
from pathlib import Path
import transformers
from tokenizers import Tokenizer, models
barrier, gguf = Path(sys.argv[1]), sys.argv[2]
config = transformers.LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1)
tiny_model = transformers.LlamaForCausalLM(config)
tiny_tokenizer = transformers.PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]")), unk_token="[UNK]")
transformers.AutoModelForCausalLM.from_pretrained = lambda *args, **kwargs: tiny_model
transformers.AutoTokenizer.from_pretrained = lambda *args, **kwargs: tiny_tokenizer
save = transformers.PreTrainedModel.save_pretrained
def save_together(self, *args, **kwargs):
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 300
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return save(self, *args, **kwargs)
transformers.PreTrainedModel.save_pretrained = save_together
from engine_service.model.loader import resolve_model
print(resolve_model(gguf)[1])
"""


@pytest.mark.slow  # two fresh processes importing transformers (~5 s each): kept out of the fast tier
def test_two_processes_converting_one_gguf_at_once_both_succeed(tmp_path: Path):
    """Two replicas starting together on an empty cache: each converts into a folder of its own and
    the first rename wins; before, they shared one `.partial` folder and one deleted the other's."""
    gguf = tmp_path / "tiny-model.gguf"
    gguf.write_bytes(b"GGUF stand-in: the converters load a tiny model instead")
    env = {**child_env(), "CONDUIT_CACHE_DIR": str(tmp_path / "cache"), "CONDUIT_THREADS": "1"}
    (tmp_path / "barrier").mkdir()
    command = [sys.executable, "-c", CONVERTER, str(tmp_path / "barrier"), str(gguf)]
    converters = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for _ in range(2)]
    results = [process.communicate(timeout=280) for process in converters]
    for process, (_, stderr) in zip(converters, results):
        assert process.returncode == 0, stderr[-3000:]
    folder = Path(results[0][0].strip())
    assert folder == Path(results[1][0].strip())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "no half-written folder is left"
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(folder).model_type == "llama" and AutoTokenizer.from_pretrained(folder)


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
