"""The test side of shim_forkserver.py: `start(argv, env, stderr)` -> a process object that the
tests use as they used subprocess.Popen's (pid, stdout, poll, wait, send_signal, terminate, kill,
returncode)."""

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
from pathlib import Path
from typing import IO

from conduit.common.lifetime import child_env

SERVER = Path(__file__).with_name("shim_forkserver.py")
_lock = threading.Lock()
_server: tuple[subprocess.Popen, str] | None = None


def _server_path() -> str:
    """The fork server's socket, started on first use (one per test process, xdist worker)."""
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="conduit-shims-"), "fork.sock")
            process = subprocess.Popen([sys.executable, str(SERVER), path], stdout=subprocess.PIPE, text=True,
                                       env=child_env(), cwd=SERVER.parent.parent)
            if process.stdout.readline().strip() != "ready":
                process.kill()
                raise RuntimeError(f"the shim fork server did not start (exit {process.wait()})")
            atexit.register(process.kill)
            _server = (process, path)
        return _server[1]


class ForkedShim:
    """A shim forked by the server. Its exit code comes over `conn` ("exit N"); a shim killed by a
    signal closes it without one, and its code is then minus the last signal sent to it."""

    def __init__(self, conn: socket.socket, stdout: IO[str], stderr: IO[str] | None, args: list[str]) -> None:
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
                raise RuntimeError("the shim fork server closed the connection before the shim started")

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


def start(argv: list[str], env: dict[str, str], cwd: Path, stderr: int | IO | None = None) -> ForkedShim:
    """`python -m http_shim ARGV` with `env` in `cwd`, forked from the server; stdout is a pipe (`.stdout`),
    stderr this process's, a file's, or a pipe (`subprocess.PIPE`: `.stderr`)."""
    out_read, out_write = os.pipe()
    err_read = None
    if stderr == subprocess.PIPE:
        err_read, err_write = os.pipe()
    else:
        err_write = os.dup(2 if stderr is None else stderr.fileno())
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_server_path())
        request = {"argv": argv, "env": env, "cwd": str(cwd)}
        socket.send_fds(conn, [json.dumps(request).encode()], [out_write, err_write])
    finally:
        os.close(out_write)
        os.close(err_write)
    return ForkedShim(conn, os.fdopen(out_read, "r"), None if err_read is None else os.fdopen(err_read, "r"),
                      ["http_shim", *argv])
