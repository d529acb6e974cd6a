"""The shim started as a Kubernetes pod starts it: a read-only root filesystem, so a home folder it
cannot write. The Responses store's default folder (~/.local/state/conduit) then cannot be made:
the shim must exit with one line naming the folder and the flag to change (no traceback), and with
`--responses-store-dir :memory:` it must serve, storing and chaining responses in memory only.

The home folder is mode 555 and holds a plain file where `.local` would go: tests may run as root,
whom the mode does not stop, but nobody can make a folder inside a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.stack import REPO_ROOT
from conduit_common.lifetime import child_env
from common import lazy_module
from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process

openai = lazy_module("openai")  # imported by the first test that uses it

STORE_VARIABLES = ("CONDUIT_RESPONSES_STORE_DIR", "XDG_STATE_HOME")


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".local").write_text("a file where the folder would go\n")
    home.chmod(0o555)
    yield home
    home.chmod(0o755)


def pod_env(home: Path) -> dict[str, str]:
    """The environment of the test process with HOME moved and the store's own variables unset."""
    env = {k: v for k, v in child_env().items() if k not in STORE_VARIABLES}
    return {**env, "HOME": str(home)}


def test_an_unwritable_store_folder_is_one_clear_line(fake: FakeEngineServer, read_only_home: Path) -> None:
    # `python -m http_shim` itself (not a fork of a prepared one): the exit and its output are the pod's.
    result = subprocess.run([sys.executable, "-m", "http_shim", "--engine", fake.address, "--port", "0"],
                            env=pod_env(read_only_home), cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    (line,) = lines
    assert "Traceback" not in line
    assert str(read_only_home / ".local" / "state" / "conduit") in line
    assert "--responses-store-dir" in line and ":memory:" in line


def test_an_in_memory_store_serves_without_writing_anything(fake: FakeEngineServer, read_only_home: Path) -> None:
    before = sorted(os.listdir(read_only_home))
    process, url = start_shim(fake.address, "--responses-store-dir", ":memory:", env=pod_env(read_only_home))
    try:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as sdk:
            first = sdk.responses.create(model=MODEL_ID, input="hi")
            assert sdk.responses.retrieve(first.id).output_text == first.output_text
            chained = sdk.responses.create(model=MODEL_ID, input="echo-request", previous_response_id=first.id)
            assert chained.previous_response_id == first.id
    finally:
        stop_process(process)
    assert sorted(os.listdir(read_only_home)) == before
    assert not list(Path(REPO_ROOT).glob(":memory:*"))  # not a folder (or SQLite file) of that name
