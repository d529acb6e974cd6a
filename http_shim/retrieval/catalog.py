"""What the vector stores hold, in SQLite (`vector_stores.sqlite3` beside the Responses store, or in
memory): the stores, their files (status, attributes, chunking, last error), file batches, and the
chunks (text and vector) with an FTS5 index of their text for keyword ranking.

Every read and write names the owner (the tenant): another tenant's store is not there. `file_counts`
are counted from the files' rows at each read, so they are true at every moment. Under gevent one
connection serves every greenlet; the lock keeps a statement and its commit together.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..ids import new_id

CATALOG_DB = "vector_stores.sqlite3"
IN_MEMORY = ":memory:"
STATUSES = ("in_progress", "completed", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stores (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
  owner TEXT NOT NULL, name TEXT NOT NULL, created_at INTEGER NOT NULL, last_active_at INTEGER NOT NULL,
  metadata TEXT NOT NULL, expires_after TEXT, description TEXT);
CREATE TABLE IF NOT EXISTS store_files (seq INTEGER PRIMARY KEY AUTOINCREMENT, store_id TEXT NOT NULL,
  file_id TEXT NOT NULL, owner TEXT NOT NULL, filename TEXT NOT NULL, batch_id TEXT, status TEXT NOT NULL,
  created_at INTEGER NOT NULL, last_error TEXT, attributes TEXT NOT NULL, chunking TEXT NOT NULL,
  usage_bytes INTEGER NOT NULL DEFAULT 0, content TEXT, UNIQUE (store_id, file_id));
CREATE TABLE IF NOT EXISTS batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
  store_id TEXT NOT NULL, owner TEXT NOT NULL, created_at INTEGER NOT NULL, cancelled INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks (id INTEGER PRIMARY KEY, store_id TEXT NOT NULL, file_id TEXT NOT NULL,
  position INTEGER NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks (store_id, file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunk_words USING fts5 (text, content='chunks', content_rowid='id');
"""


@dataclass
class StoreFile:
    store_id: str
    file_id: str
    filename: str
    batch_id: str | None
    status: str
    created_at: int
    last_error: dict[str, str] | None
    attributes: dict[str, Any]
    chunking: dict[str, Any]
    usage_bytes: int

    def as_object(self) -> dict[str, Any]:
        return {"id": self.file_id, "object": "vector_store.file", "created_at": self.created_at,
                "vector_store_id": self.store_id, "status": self.status, "last_error": self.last_error,
                "usage_bytes": self.usage_bytes, "attributes": self.attributes, "chunking_strategy": self.chunking}


_FILE_COLUMNS = ("store_id, file_id, filename, batch_id, status, created_at, last_error, attributes, chunking, "
                 "usage_bytes")


def _store_file(row: tuple) -> StoreFile:
    return StoreFile(row[0], row[1], row[2], row[3], row[4], row[5], json.loads(row[6]) if row[6] else None,
                     json.loads(row[7]), json.loads(row[8]), row[9])


class Catalog:
    def __init__(self, store_dir: str) -> None:
        path = IN_MEMORY if store_dir == IN_MEMORY else str(Path(store_dir) / CATALOG_DB)
        if path != IN_MEMORY:
            Path(store_dir).mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.RLock()

    def _rows(self, query: str, args: tuple | list = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(query, args).fetchall()

    def _write(self, query: str, args: tuple | list = ()) -> int:
        with self._lock:
            return self._db.execute(query, args).rowcount

    # ---------------------------------------------------------------- stores

    def create_store(self, owner: str, name: str, metadata: dict[str, str], expires_after: dict | None,
                     description: str | None) -> str:
        store_id, now = new_id("vs"), int(time.time())
        self._write("INSERT INTO stores (id, owner, name, created_at, last_active_at, metadata, expires_after,"
                    " description) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (store_id, owner, name, now, now, json.dumps(metadata),
                     json.dumps(expires_after) if expires_after else None, description))
        return store_id

    def store(self, owner: str, store_id: str) -> dict[str, Any] | None:
        """The store's object (OpenAI's `vector_store`), or None: unknown, another tenant's, or expired."""
        rows = self._rows("SELECT id, name, created_at, last_active_at, metadata, expires_after, description"
                          " FROM stores WHERE id = ? AND owner = ?", (store_id, owner))
        return self._store_object(rows[0]) if rows else None

    def _store_object(self, row: tuple) -> dict[str, Any]:
        store_id, name, created_at, last_active_at, metadata, expires_after, description = row
        counts = self.file_counts(store_id)
        expiry = json.loads(expires_after) if expires_after else None
        expires_at = last_active_at + expiry["days"] * 86400 if expiry else None
        status = "in_progress" if counts["in_progress"] else "completed"
        if expires_at is not None and expires_at <= time.time():
            status = "expired"
        usage = self._rows("SELECT COALESCE(SUM(usage_bytes), 0) FROM store_files WHERE store_id = ?",
                           (store_id,))[0][0]
        out = {"id": store_id, "object": "vector_store", "created_at": created_at, "name": name,
               "usage_bytes": usage, "file_counts": counts, "status": status, "expires_after": expiry,
               "expires_at": expires_at, "last_active_at": last_active_at, "metadata": json.loads(metadata)}
        if description is not None:
            out["description"] = description
        return out

    def file_counts(self, store_id: str, batch_id: str | None = None) -> dict[str, int]:
        query = "SELECT status, COUNT(*) FROM store_files WHERE store_id = ?"
        args: list[Any] = [store_id]
        if batch_id is not None:
            query += " AND batch_id = ?"
            args.append(batch_id)
        counts = dict.fromkeys(STATUSES, 0) | dict(self._rows(query + " GROUP BY status", args))
        return {**counts, "total": sum(counts.values())}

    def list_stores(self, owner: str, after: str | None, limit: int, order: str) -> tuple[list[dict], bool]:
        rows = self._page("stores", "owner = ?", [owner], "id", after, limit, order,
                          "id, name, created_at, last_active_at, metadata, expires_after, description")
        return [self._store_object(r) for r in rows[:limit]], len(rows) > limit

    def _page(self, table: str, where: str, args: list, id_column: str, after: str | None, limit: int,
              order: str, columns: str) -> list[tuple]:
        """Up to limit + 1 rows after the row `after` names (within the same `where`)."""
        sign, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        query = f"SELECT {columns} FROM {table} WHERE {where}"
        if after is not None:
            query += f" AND seq {sign} (SELECT seq FROM {table} WHERE {where} AND {id_column} = ?)"
            args = args + args + [after]
        return self._rows(query + f" ORDER BY seq {direction} LIMIT ?", args + [limit + 1])

    def update_store(self, owner: str, store_id: str, fields: dict[str, Any]) -> None:
        for column, value in fields.items():  # columns from VectorStoreUpdate's fields only
            stored = json.dumps(value) if column in ("metadata", "expires_after") else value
            self._write(f"UPDATE stores SET {column} = ? WHERE id = ? AND owner = ?", (stored, store_id, owner))

    def touch(self, store_id: str) -> None:
        """A search or a new file: the store is active (its expiry counts from now)."""
        self._write("UPDATE stores SET last_active_at = ? WHERE id = ?", (int(time.time()), store_id))

    def delete_store(self, owner: str, store_id: str) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if not self._db.execute("DELETE FROM stores WHERE id = ? AND owner = ?", (store_id, owner)).rowcount:
                return False
            self._db.execute("DELETE FROM store_files WHERE store_id = ?", (store_id,))
            self._db.execute("DELETE FROM batches WHERE store_id = ?", (store_id,))
            self._delete_chunks("store_id = ?", (store_id,))
        return True

    def _delete_chunks(self, where: str, args: tuple) -> None:
        self._db.execute(f"INSERT INTO chunk_words (chunk_words, rowid, text) SELECT 'delete', id, text FROM chunks"
                         f" WHERE {where}", args)
        self._db.execute(f"DELETE FROM chunks WHERE {where}", args)

    # ---------------------------------------------------------------- files of stores

    def add_file(self, owner: str, store_id: str, file_id: str, filename: str, attributes: dict[str, Any],
                 chunking: dict[str, Any], batch_id: str | None = None) -> StoreFile:
        """A file joins the store, waiting for ingestion (added again: its chunks go and it waits again)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._delete_chunks("store_id = ? AND file_id = ?", (store_id, file_id))
            self._db.execute("DELETE FROM store_files WHERE store_id = ? AND file_id = ?", (store_id, file_id))
            self._db.execute("INSERT INTO store_files (store_id, file_id, owner, filename, batch_id, status,"
                             " created_at, attributes, chunking) VALUES (?, ?, ?, ?, ?, 'in_progress', ?, ?, ?)",
                             (store_id, file_id, owner, filename, batch_id, int(time.time()), json.dumps(attributes),
                              json.dumps(chunking)))
        return self.store_file(owner, store_id, file_id)

    def store_file(self, owner: str, store_id: str, file_id: str) -> StoreFile | None:
        rows = self._rows(f"SELECT {_FILE_COLUMNS} FROM store_files WHERE store_id = ? AND file_id = ? AND owner = ?",
                          (store_id, file_id, owner))
        return _store_file(rows[0]) if rows else None

    def list_files(self, owner: str, store_id: str, after: str | None, limit: int, order: str,
                   status: str | None, batch_id: str | None = None) -> tuple[list[StoreFile], bool]:
        where, args = "store_id = ? AND owner = ?", [store_id, owner]
        if status is not None:
            where, args = where + " AND status = ?", args + [status]
        if batch_id is not None:
            where, args = where + " AND batch_id = ?", args + [batch_id]
        rows = self._page("store_files", where, args, "file_id", after, limit, order, _FILE_COLUMNS)
        return [_store_file(r) for r in rows[:limit]], len(rows) > limit

    def files_of(self, store_ids: list[str]) -> dict[tuple[str, str], StoreFile]:
        """Every completed file of these stores, by (store, file): what a search may return."""
        marks = ",".join("?" * len(store_ids))
        rows = self._rows(f"SELECT {_FILE_COLUMNS} FROM store_files WHERE status = 'completed' AND store_id IN"
                          f" ({marks})", store_ids)
        return {(r[0], r[1]): _store_file(r) for r in rows}

    def set_attributes(self, owner: str, store_id: str, file_id: str, attributes: dict[str, Any]) -> None:
        self._write("UPDATE store_files SET attributes = ? WHERE store_id = ? AND file_id = ? AND owner = ?",
                    (json.dumps(attributes), store_id, file_id, owner))

    def remove_file(self, owner: str, store_id: str, file_id: str) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            gone = self._db.execute("DELETE FROM store_files WHERE store_id = ? AND file_id = ? AND owner = ?",
                                    (store_id, file_id, owner)).rowcount
            if gone:
                self._delete_chunks("store_id = ? AND file_id = ?", (store_id, file_id))
        return bool(gone)

    def file_text(self, owner: str, store_id: str, file_id: str) -> str | None:
        rows = self._rows("SELECT content FROM store_files WHERE store_id = ? AND file_id = ? AND owner = ?",
                          (store_id, file_id, owner))
        return rows[0][0] if rows else None

    # ---------------------------------------------------------------- ingestion's side

    def waiting(self) -> list[tuple[str, str, str]]:
        """(store, file, owner) of every file in progress: at start, what a restart interrupted."""
        return self._rows("SELECT store_id, file_id, owner FROM store_files WHERE status = 'in_progress' ORDER BY seq")

    def finish_file(self, store_id: str, file_id: str, text: str, chunks: list[str], vectors: np.ndarray,
                    chunking: dict[str, Any]) -> list[int] | None:
        """The file's chunks in, and it is completed, in one transaction; None (nothing written) when
        the file left the store meanwhile (removed, the store deleted, the batch cancelled)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if not self._db.execute("SELECT 1 FROM store_files WHERE store_id = ? AND file_id = ? AND"
                                    " status = 'in_progress'", (store_id, file_id)).fetchone():
                return None
            ids = []
            for position, (chunk, vector) in enumerate(zip(chunks, vectors)):
                cursor = self._db.execute("INSERT INTO chunks (store_id, file_id, position, text, vector)"
                                          " VALUES (?, ?, ?, ?, ?)",
                                          (store_id, file_id, position, chunk, vector.astype(np.float32).tobytes()))
                ids.append(cursor.lastrowid)
                self._db.execute("INSERT INTO chunk_words (rowid, text) VALUES (?, ?)", (cursor.lastrowid, chunk))
            usage = len(text.encode()) + vectors.astype(np.float32).nbytes
            self._db.execute("UPDATE store_files SET status = 'completed', usage_bytes = ?, content = ?, chunking = ?"
                             " WHERE store_id = ? AND file_id = ?",
                             (usage, text, json.dumps(chunking), store_id, file_id))
        return ids

    def fail_file(self, store_id: str, file_id: str, code: str, message: str) -> None:
        self._write("UPDATE store_files SET status = 'failed', last_error = ? WHERE store_id = ? AND file_id = ?"
                    " AND status = 'in_progress'", (json.dumps({"code": code, "message": message}), store_id, file_id))

    def still_wanted(self, store_id: str, file_id: str) -> bool:
        return bool(self._rows("SELECT 1 FROM store_files WHERE store_id = ? AND file_id = ? AND"
                               " status = 'in_progress'", (store_id, file_id)))

    # ---------------------------------------------------------------- batches

    def create_batch(self, owner: str, store_id: str) -> str:
        batch_id = new_id("vsfb")
        self._write("INSERT INTO batches (id, store_id, owner, created_at) VALUES (?, ?, ?, ?)",
                    (batch_id, store_id, owner, int(time.time())))
        return batch_id

    def batch(self, owner: str, store_id: str, batch_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT created_at, cancelled FROM batches WHERE id = ? AND store_id = ? AND owner = ?",
                          (batch_id, store_id, owner))
        if not rows:
            return None
        counts = self.file_counts(store_id, batch_id)
        if counts["in_progress"]:
            status = "in_progress"
        elif rows[0][1]:
            status = "cancelled"
        else:
            status = "failed" if counts["failed"] and not counts["completed"] else "completed"
        return {"id": batch_id, "object": "vector_store.files_batch", "created_at": rows[0][0],
                "vector_store_id": store_id, "status": status, "file_counts": counts}

    def cancel_batch(self, owner: str, store_id: str, batch_id: str) -> None:
        """Files of the batch not yet ingested become cancelled (one being embedded is dropped when it ends)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("UPDATE batches SET cancelled = 1 WHERE id = ? AND owner = ?", (batch_id, owner))
            self._db.execute("UPDATE store_files SET status = 'cancelled' WHERE batch_id = ? AND store_id = ? AND"
                             " status = 'in_progress'", (batch_id, store_id))

    # ---------------------------------------------------------------- search's side

    def vectors(self, store_id: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(chunk ids, vectors as rows, file id of each) of a store: what the index packs."""
        rows = self._rows("SELECT c.id, c.vector, c.file_id FROM chunks c JOIN store_files f ON"
                          " f.store_id = c.store_id AND f.file_id = c.file_id WHERE c.store_id = ? AND"
                          " f.status = 'completed' ORDER BY c.id", (store_id,))
        if not rows:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32), []
        ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        vectors = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)
        return ids, vectors, [r[2] for r in rows]

    def keyword_hits(self, store_ids: list[str], query: str, limit: int) -> list[int]:
        """Chunk ids by BM25 rank for the query's words (any of them), best first."""
        words = [w for w in "".join(c if c.isalnum() else " " for c in query).split() if len(w) > 1]
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in words)
        marks = ",".join("?" * len(store_ids))
        rows = self._rows(f"SELECT chunk_words.rowid FROM chunk_words JOIN chunks ON chunks.id = chunk_words.rowid"
                          f" WHERE chunk_words MATCH ? AND chunks.store_id IN ({marks}) ORDER BY rank LIMIT ?",
                          [match, *store_ids, limit])
        return [r[0] for r in rows]

    def chunks(self, ids: list[int]) -> dict[int, tuple[str, str, str]]:
        """id -> (store, file, text)."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return {r[0]: (r[1], r[2], r[3]) for r in self._rows(
            f"SELECT id, store_id, file_id, text FROM chunks WHERE id IN ({marks})", ids)}
