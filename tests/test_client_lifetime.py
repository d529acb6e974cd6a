"""Processes the launcher starts die with it: a SIGKILLed test run or launcher leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conduit_common.lifetime import ENV_VAR

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

# A launcher process: starts the shim the way Stack.start() does, reports its pid and URL, then waits.
LAUNCHER = """
import sys, time
from launcher.stack import Stack, spawn
stack = Stack(engine_port=int(sys.argv[1]), log_dir=sys.argv[2])
shim = spawn(stack.shim_command(), stack.shim_log)
print(shim.pid, stack.shim_url, flush=True)
time.sleep(300)
"""


def unused_port() -> int:
    """A loopback port with nothing listening: the shim's engine is down, which it tolerates."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gone(pid: int) -> bool:
    """The process has exited (an unreaped zombie counts: it runs nothing and holds no port)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def answers_http(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:  # 503 while the engine is down: the shim is serving
        return True
    except OSError:
        return False
    return True


def test_a_killed_launcher_takes_its_shim_down(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(unused_port()), str(tmp_path)],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    shim_pid = None
    try:
        line = launcher.stdout.readline()
        assert line, f"the launcher exited (code {launcher.wait()})"
        pid, url = line.split()
        shim_pid = int(pid)
        # Once it serves, the shim has long passed its die-with-parent setup.
        assert wait_until(lambda: answers_http(f"{url}/health") or gone(shim_pid), 60), "the shim never served"
        assert not gone(shim_pid), (tmp_path / "shim.log").read_text()
        launcher.kill()  # SIGKILL: no chance to stop its children
        launcher.wait()
        assert wait_until(lambda: gone(shim_pid), 10), "the shim outlived its SIGKILLed launcher"
        assert not answers_http(f"{url}/health")
    finally:
        launcher.kill()
        launcher.wait()
        if shim_pid is not None and not gone(shim_pid):
            os.kill(shim_pid, signal.SIGKILL)


@pytest.mark.parametrize("module", ["http_shim", "engine_service"])
def test_a_child_whose_parent_already_died_exits(module: str) -> None:
    """The parent died before the child asked for the signal, which then would never come."""
    departed = subprocess.Popen([sys.executable, "-c", "pass"])
    departed.wait()
    env = {**os.environ, ENV_VAR: str(departed.pid)}  # the pid of a parent that is no more
    args = ["--engine", f"127.0.0.1:{unused_port()}"] if module == "http_shim" else ["--model", "/nonexistent"]
    result = subprocess.run([sys.executable, "-m", module, "--port", str(unused_port()), *args], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"parent process {departed.pid} exited" in result.stderr
