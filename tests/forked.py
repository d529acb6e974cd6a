"""The test side of forkserver.py: `start(program, argv, env, cwd)` -> a process object that the tests
use as they used subprocess.Popen's (pid, stdout, poll, wait, send_signal, terminate, kill,
returncode); `spawn` is launcher.stack.spawn's double, which forks the stacks' engines and shims."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from launcher.stack import REPO_ROOT
from launcher.stack import spawn as launch_spawn
from conduit_common.lifetime import child_env

SERVER = Path(__file__).with_name("forkserver.py")
PROGRAMS = ("http_shim", "engine_service")
_lock = threading.Lock()
_servers: dict[str, tuple[subprocess.Popen, str]] = {}


def _server_path(program: str) -> str:
    """The program's fork server's socket, started on first use (one per test process, xdist worker)."""
    with _lock:
        if program not in _servers or _servers[program][0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix=f"conduit-{program}-"), "fork.sock")
            process = subprocess.Popen([sys.executable, str(SERVER), program, path], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, text=True, env=child_env(), cwd=REPO_ROOT)
            if process.stdout.readline().strip() != "ready":
                process.kill()
                raise RuntimeError(f"the {program} fork server did not start (exit {process.wait()})")
            atexit.register(process.kill)
            _servers[program] = (process, path)
        return _servers[program][1]


class ForkedProcess:
    """A process forked by a server. Its exit code comes over `conn` ("exit N"); one killed by a
    signal closes it without one, and its code is then minus the last signal sent to it."""

    def __init__(self, conn: socket.socket, stdout: IO[str] | None, stderr: IO[str] | None, args: list[str]) -> None:
        self._conn = conn
        self._pending = b""
        self._last_signal = signal.SIGKILL
        self.args = args
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self.pid = 0
        while not self.pid:
            if not self._read(None):
                raise RuntimeError(f"the fork server closed the connection before {args[0]} started")

    def _read(self, timeout: float | None) -> bool:
        """Takes what the connection has within `timeout`; False at its end."""
        if not select.select([self._conn], [], [], timeout)[0]:
            return True
        data = self._conn.recv(4096)
        if not data:
            if self.returncode is None:
                self.returncode = -int(self._last_signal)
            return False
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            kind, value = line.decode().split()
            if kind == "pid":
                self.pid = int(value)
            else:
                self.returncode = int(value)
        return True

    def poll(self) -> int | None:
        while self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._last_signal = sig
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(program: str, argv: list[str], env: dict[str, str], cwd: Path, stderr: int | IO | None = None,
          stdout: IO | None = None) -> ForkedProcess:
    """`python -m PROGRAM ARGV` with `env` in `cwd`, forked from the program's server; stdout a file's or
    a pipe (`.stdout`), stderr this process's, a file's, or a pipe (`subprocess.PIPE`: `.stderr`)."""
    out_read = None
    if stdout is None:
        out_read, out_write = os.pipe()
    else:
        out_write = os.dup(stdout.fileno())
    err_read = None
    if stderr == subprocess.PIPE:
        err_read, err_write = os.pipe()
    else:
        err_write = os.dup(2 if stderr is None else stderr.fileno())
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_server_path(program))
        request = {"argv": argv, "env": env, "cwd": str(cwd)}
        socket.send_fds(conn, [json.dumps(request).encode()], [out_write, err_write])
    finally:
        os.close(out_write)
        os.close(err_write)
    return ForkedProcess(conn, None if out_read is None else os.fdopen(out_read, "r"),
                         None if err_read is None else os.fdopen(err_read, "r"), [program, *argv])


def spawn(cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None,
          append: bool = False) -> ForkedProcess | subprocess.Popen[bytes]:
    """launcher.stack.spawn for the tests' stacks: `python -m engine_service` and `python -m http_shim`
    forked from their servers, with what spawn gives them (the log for both outputs, the environment,
    the repository as the working folder, a session of its own); any other command as spawn runs it."""
    if cmd[:2] != [sys.executable, "-m"] or cmd[2] not in PROGRAMS:
        return launch_spawn(cmd, log_path, env, append)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if append else "wb") as log:
        child = child_env({**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})
        return start(cmd[2], cmd[3:], child, REPO_ROOT, stderr=log, stdout=log)
