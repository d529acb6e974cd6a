"""The response store behind `store` and `previous_response_id`: SQLite from the standard library.

One file (`responses.sqlite3`) per shim under --responses-store-dir, in WAL mode so a reader never waits on
the writer and a crash loses at most the last write; or `:memory:` (this process only, for a read-only
filesystem). Bounded by count and age: each write evicts the oldest past either bound, so a chain whose start
was evicted answers 404 (as at OpenAI after 30 days). A row holds the response and its whole context (every
input item, inherited ones included, not `instructions`), so continuing a chain reads one row.

Under gevent every greenlet runs on one OS thread and a sqlite3 call never yields, so one connection
serves them all; the lock only keeps a statement and its commit together.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STORE_FILE = "responses.sqlite3"
DEFAULT_MAX_RESPONSES = 10_000
DEFAULT_MAX_AGE_S = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days
STORE_DIR_ENV = "CONDUIT_RESPONSES_STORE_DIR"
IN_MEMORY = ":memory:"  # SQLite's own name for a database that lives in the process only


class StoreError(Exception):
    """The store's folder cannot be written: the operator must point the flag elsewhere."""


def default_store_dir() -> str:
    """$CONDUIT_RESPONSES_STORE_DIR (the flag's variable), else $XDG_STATE_HOME/conduit
    (~/.local/state/conduit): state that should outlive a restart."""
    if os.environ.get(STORE_DIR_ENV) is not None:
        return os.environ[STORE_DIR_ENV]
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return str(Path(base) / "conduit")


@dataclass(frozen=True)
class StoreLimits:
    max_responses: int = DEFAULT_MAX_RESPONSES
    max_age_s: float = DEFAULT_MAX_AGE_S

    def __post_init__(self) -> None:
        if self.max_responses < 1 or self.max_age_s <= 0:
            raise ValueError("the response store's count and age bounds must be positive")


@dataclass
class StoredResponse:
    response: dict[str, Any]
    context: list[dict[str, Any]]  # the input items it was generated from, inherited ones included


class ResponseStore:
    def __init__(self, folder: Path | str, limits: StoreLimits = StoreLimits()) -> None:
        """`folder`: where the file goes, or IN_MEMORY. Raises StoreError when it cannot be written."""
        self.path = None if str(folder) == IN_MEMORY else Path(folder) / STORE_FILE
        self.limits = limits
        self._lock = threading.Lock()
        try:
            self._db = self._open()
        except (OSError, sqlite3.Error) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise StoreError(
                f"the Responses store cannot write its folder {folder} ({reason}): give --responses-store-dir "
                f"({STORE_DIR_ENV}) a writable folder, or {IN_MEMORY} to keep stored responses in memory only, "
                "or '' to keep none") from None

    def _open(self) -> sqlite3.Connection:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path or IN_MEMORY, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # an in-memory database keeps its own ("memory")
        db.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint; WAL keeps it consistent
        db.execute(
            "CREATE TABLE IF NOT EXISTS responses ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, stored_at REAL NOT NULL,"
            " response TEXT NOT NULL, context TEXT NOT NULL)"
        )
        columns = [row[1] for row in db.execute("PRAGMA table_info(responses)")]
        if "owner" not in columns:  # a file from before tenants: its responses belong to no key ('')
            db.execute("ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
        # A write of what is there: a file that can only be read fails here, not at the first answer stored.
        (version,) = db.execute("PRAGMA user_version").fetchone()
        db.execute(f"PRAGMA user_version = {int(version)}")
        return db

    def put(self, response: dict[str, Any], context: list[dict[str, Any]], owner: str = "") -> None:
        """Stores (or replaces) a response, then evicts the oldest past the bounds. `owner`: the tenant
        (auth.tenant), the only one that reads it back."""
        row = (response["id"], time.time(), json.dumps(response), json.dumps(context), owner)
        with self._lock, self._db:  # the connection commits, or rolls back on any exception
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM responses WHERE id = ?", row[:1])
            self._db.execute("INSERT INTO responses (id, stored_at, response, context, owner) VALUES (?, ?, ?, ?, ?)",
                             row)
            self._evict()

    def _evict(self) -> None:
        self._db.execute("DELETE FROM responses WHERE stored_at < ?", (time.time() - self.limits.max_age_s,))
        self._db.execute(
            "DELETE FROM responses WHERE seq <= (SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (self.limits.max_responses,),
        )

    def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, context FROM responses WHERE id = ? AND owner = ? AND stored_at >= ?",
                (response_id, owner, time.time() - self.limits.max_age_s),
            ).fetchone()
        return None if row is None else StoredResponse(json.loads(row[0]), json.loads(row[1]))

    def delete(self, response_id: str, owner: str = "") -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ?",
                                    (response_id, owner)).rowcount > 0
