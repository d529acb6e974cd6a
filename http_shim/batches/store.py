"""The Batch API's store: each batch's object, and its requests with their outcomes as they complete,
in SQLite (`batches.sqlite3` beside the Files and Responses stores' files; `:memory:`: this process only).

A batch's object (the openai SDK's `Batch`) is kept as JSON with its owner (the tenant: auth.tenant),
its status, and the runner that runs it (runner.py: a shim's, while that shim lives) beside it. Its
requests are rows written at validation; each gets its outcome (the output or error file's line) as it
completes, committed at once, so a shim that stops mid-batch resumes with the rows that have none
(runner.py). Once the output and error files are written the rows go; `request_counts` and `usage`
stay in the object.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files.store import IN_MEMORY
from ..ids import new_id
from .lines import BatchLine
from .protocol import COMPLETION_WINDOW_S

BATCHES_DB = "batches.sqlite3"
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # the runner still owes them work
FINAL = ("failed", "completed", "expired", "cancelled")
_USAGE = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")


def new_batch(input_file_id: str, endpoint: str, metadata: dict[str, str] | None,
              output_expires_after_s: int | None) -> dict[str, Any]:
    """A batch as created: `validating`, to expire 24 hours on."""
    now = int(time.time())
    return {"id": new_id("batch"), "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": "24h", "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + COMPLETION_WINDOW_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata, "model": None,
            "usage": None, "output_expires_after_s": output_expires_after_s}


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The object as clients see it (without what the shim keeps for itself)."""
    return {k: v for k, v in batch.items() if k != "output_expires_after_s"}


@dataclass
class Outcome:
    """A completed request: its line of the output file (ok) or of the error file, and its tokens."""

    line: dict[str, Any]
    ok: bool
    usage: tuple[int, int, int, int] = (0, 0, 0, 0)  # input, cached, output, reasoning


class BatchStore:
    def __init__(self, store_dir: str) -> None:
        """`store_dir`: the Responses store's folder (or IN_MEMORY), as the Files API's."""
        memory = store_dir == IN_MEMORY
        self._lock = threading.Lock()
        self._db = sqlite3.connect(IN_MEMORY if memory else str(Path(store_dir) / BATCHES_DB),
                                   check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, status TEXT NOT NULL, object TEXT NOT NULL, "
                         "runner TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS requests (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, "
                         "custom_id TEXT NOT NULL, body TEXT NOT NULL, outcome TEXT, ok INTEGER, "
                         + ", ".join(f"{u} INTEGER" for u in _USAGE) + ", PRIMARY KEY (batch_id, idx))")

    # ---------------------------------------------------------------- batches

    def create(self, owner: str, batch: dict[str, Any], runner: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO batches (id, owner, status, object, runner) VALUES (?, ?, ?, ?, ?)",
                             (batch["id"], owner, batch["status"], json.dumps(batch), runner))

    def runner(self, batch_id: str) -> str | None:
        with self._lock:
            return self._db.execute("SELECT runner FROM batches WHERE id = ?", (batch_id,)).fetchone()[0]

    def claim(self, batch_id: str, runner: str, previous: str | None) -> bool:
        """The batch is `runner`'s now, unless another claimed it since `previous` was read."""
        with self._lock:
            return self._db.execute("UPDATE batches SET runner = ? WHERE id = ? AND runner IS ?",
                                    (runner, batch_id, previous)).rowcount == 1

    def status(self, batch_id: str) -> str:
        with self._lock:
            return self._db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()[0]

    def save(self, batch: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("UPDATE batches SET status = ?, object = ? WHERE id = ?",
                             (batch["status"], json.dumps(batch), batch["id"]))

    def get(self, owner: str | None, batch_id: str) -> dict[str, Any] | None:
        """The batch (None: not the owner's, or none), its counts and usage current while it runs.
        owner None: whoever's (the runner's own reads)."""
        query, args = "SELECT object FROM batches WHERE id = ?", [batch_id]
        if owner is not None:
            query += " AND owner = ?"
            args.append(owner)
        with self._lock:
            row = self._db.execute(query, args).fetchone()
        return None if row is None else self._current(json.loads(row[0]))

    def owner(self, batch_id: str) -> str:
        with self._lock:
            return self._db.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()[0]

    def list(self, owner: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """A page of the owner's batches, newest first, and whether more follow."""
        query, args = "SELECT object FROM batches WHERE owner = ?", [owner]
        if after is not None:
            query += " AND seq < (SELECT seq FROM batches WHERE id = ? AND owner = ?)"
            args += [after, owner]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY seq DESC LIMIT ?", [*args, limit + 1]).fetchall()
        batches = [self._current(json.loads(row[0])) for row in rows]
        return batches[:limit], len(batches) > limit

    def active(self) -> list[str]:
        """The batches a runner must take up again (a start after a stop mid-way), oldest first."""
        with self._lock:
            rows = self._db.execute(f"SELECT id FROM batches WHERE status IN ({','.join('?' * len(ACTIVE))}) "
                                    "ORDER BY seq", ACTIVE).fetchall()
        return [row[0] for row in rows]

    def counts_by_status(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall()
        return dict(rows)

    def _current(self, batch: dict[str, Any]) -> dict[str, Any]:
        if batch["status"] in ("in_progress", "finalizing", "cancelling"):
            batch["request_counts"], batch["usage"] = self.tally(batch["id"])
        return batch

    # ---------------------------------------------------------------- requests

    def add_requests(self, batch_id: str, lines: list[BatchLine]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR IGNORE INTO requests (batch_id, idx, custom_id, body) VALUES (?, ?, ?, ?)",
                                 [(batch_id, line.index, line.custom_id, json.dumps(line.body)) for line in lines])
            self._db.execute("COMMIT")

    def pending(self, batch_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """(index, custom_id, body) of the requests without an outcome, in file order."""
        with self._lock:
            rows = self._db.execute("SELECT idx, custom_id, body FROM requests WHERE batch_id = ? AND outcome IS NULL "
                                    "ORDER BY idx", (batch_id,)).fetchall()
        return [(idx, custom_id, json.loads(body)) for idx, custom_id, body in rows]

    def record(self, batch_id: str, index: int, outcome: Outcome) -> None:
        with self._lock:
            self._db.execute(f"UPDATE requests SET outcome = ?, ok = ?, {', '.join(f'{u} = ?' for u in _USAGE)} "
                             "WHERE batch_id = ? AND idx = ?",
                             (json.dumps(outcome.line), int(outcome.ok), *outcome.usage, batch_id, index))

    def outcomes(self, batch_id: str) -> list[tuple[bool, dict[str, Any]]]:
        """(ok, line) of the requests that have an outcome, in file order."""
        with self._lock:
            rows = self._db.execute("SELECT ok, outcome FROM requests WHERE batch_id = ? AND outcome IS NOT NULL "
                                    "ORDER BY idx", (batch_id,)).fetchall()
        return [(bool(ok), json.loads(line)) for ok, line in rows]

    def tally(self, batch_id: str) -> tuple[dict[str, int], dict[str, Any] | None]:
        """`request_counts` and `usage` as the requests' outcomes say."""
        with self._lock:
            row = self._db.execute("SELECT COUNT(*), COALESCE(SUM(ok), 0), "
                                   "COALESCE(SUM(outcome IS NOT NULL AND ok = 0), 0), "
                                   + ", ".join(f"COALESCE(SUM({u}), 0)" for u in _USAGE)
                                   + " FROM requests WHERE batch_id = ?", (batch_id,)).fetchone()
        total, completed, failed, inputs, cached, outputs, reasoning = row
        usage = {"input_tokens": inputs, "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": outputs, "output_tokens_details": {"reasoning_tokens": reasoning},
                 "total_tokens": inputs + outputs}
        return {"total": total, "completed": completed, "failed": failed}, usage

    def drop_requests(self, batch_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM requests WHERE batch_id = ?", (batch_id,))
