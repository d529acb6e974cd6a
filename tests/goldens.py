"""transformers' reference outputs, checked in under tests/golden/, so the tests that compare the
engine with transformers on the real models do not run transformers' `generate` on every run.

`make goldens` (python tests/goldens.py) writes them anew: after a change of model, prompts, token
counts or transformers version. Each entry records what made it (the prompt's token ids, the
transformers version), and a test whose prompt no longer matches fails and says to regenerate.

A greedy reference keeps, for each token, its id, its logprob and its margin over the runner-up.
On another CPU float rounding may swap two near-tied tokens, so a comparison with a golden
stops at the reference's first near-tie (NEAR_TIE).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
# Below this margin (nats) between the reference's top two tokens, another CPU may pick the other one.
NEAR_TIE = 1e-3


def load(name: str, prompt_ids: list[list[int]]) -> list[dict[str, Any]]:
    """The golden entries of `name` for these prompts (in order); fails when they are stale."""
    path = GOLDEN_DIR / f"{name}.json"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make goldens`")
    entries = json.loads(path.read_text())["entries"]
    if [e["prompt_ids"] for e in entries] != prompt_ids:
        pytest.fail(f"{path} was made for other prompts: run `make goldens`")
    return entries


def write(name: str, entries: list[dict[str, Any]]) -> Path:
    import transformers

    GOLDEN_DIR.mkdir(exist_ok=True)
    path = GOLDEN_DIR / f"{name}.json"
    document = {"made_by": "make goldens (tests/goldens.py)", "transformers": transformers.__version__,
                "entries": entries}
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def main() -> int:
    # The test modules own their prompts and how a reference is computed.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_model_families
    import test_quantization

    for name, entries in [*test_model_families.compute_goldens().items(), *test_quantization.compute_goldens().items()]:
        print(f"wrote {write(name, entries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
