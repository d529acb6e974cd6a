"""Which shim runs a batch. A store folder may be opened by several shims (tests start many on one
folder; an operator may restart one beside the old one while it drains), and a batch must run in one
of them only. Each runner holds an exclusive lock on a file of its own (`batch-runners/<id>.lock`)
for as long as its process lives; a batch records its runner, and another runner takes it over only
when that lock is free (the process ended, however it ended). In memory (`:memory:`) the store is
this process's alone."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..files.store import IN_MEMORY
from ..ids import new_id

RUNNERS_FOLDER = "batch-runners"


class RunnerClaims:
    def __init__(self, store_dir: str) -> None:
        self.id = new_id("runner")
        self._folder = None if store_dir == IN_MEMORY else Path(store_dir) / RUNNERS_FOLDER
        if self._folder is not None:
            self._folder.mkdir(parents=True, exist_ok=True)
            self._held = os.open(self._folder / f"{self.id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # kept open (and locked) until exit

    def alive(self, runner: str | None) -> bool:
        """Whether `runner` (a batch's) still runs in some process; ours does."""
        if runner is None or self._folder is None:
            return runner == self.id
        if runner == self.id:
            return True
        path = self._folder / f"{os.path.basename(runner)}.lock"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # (releases the lock just taken)
        path.unlink(missing_ok=True)  # a runner gone: its file with it
        return False
