"""Child processes that die with their parent.

A parent that is SIGKILLed (a killed test run, `kill -9` on `python -m launcher.stack`) gets no
chance to stop the engine and shim it started. So each child asks the kernel itself, first thing,
for a SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG). The child does it rather than a
`preexec_fn` in the parent: code run between fork and exec conflicts with grpc's fork handlers.

The parent opts in with `child_env()`, which puts its own pid in CONDUIT_DIE_WITH_PARENT; the
child's entry point calls `die_with_parent()`. Standard library only: the engine calls it before
importing torch, the shim right after gevent's monkey-patching.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

ENV_VAR = "CONDUIT_DIE_WITH_PARENT"
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) plus the request that the child die with us.

    The kernel signals the child when the *thread* that spawned it exits, not when the whole
    process does: spawn from the main thread (as `launcher.stack.Stack` and the tests do), or from
    a thread that lives as long as the children should.
    """
    return {**(os.environ if env is None else env), ENV_VAR: str(os.getpid())}


def die_with_parent() -> None:
    """When the parent asked for it (see `child_env`), get SIGTERM as soon as the parent dies.

    Exits at once if the parent is already gone (it died before this ran, so no signal would
    come). A no-op when not asked, and off Linux.
    """
    value = os.environ.pop(ENV_VAR, None)  # our own children (if any) were not asked
    if not value or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)  # the running process's symbols include libc's
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        print(f"warning: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}", file=sys.stderr, flush=True)
        return
    try:
        expected = int(value)
    except ValueError:
        return  # no pid to compare with; the signal is set all the same
    if os.getppid() != expected:
        print(f"parent process {expected} exited before this one started; exiting", file=sys.stderr, flush=True)
        sys.exit(1)
