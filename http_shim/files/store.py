"""The Files API's store: each file's bytes on disk under `<store dir>/files/`, its record in SQLite
(`files.sqlite3` beside the Responses store's file), or both in this process only (`:memory:`).

Used by the Files routes, vector store ingestion (which reads a file's bytes) and, later, batches.
Every record has an owner (the tenant: auth.tenant), and every read names one: another tenant's
file is simply not there. An upload streams into a temporary file that becomes the file only when
complete and within the limits, so a refused or cut upload leaves nothing behind.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..ids import new_id

FILES_DB = "files.sqlite3"
FILES_FOLDER = "files"
IN_MEMORY = ":memory:"
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_STORE_BYTES = 4 * 1024 * 1024 * 1024
PURPOSES = ("assistants", "batch", "user_data", "fine-tune", "vision", "evals")


class TooLarge(Exception):
    """An upload past a limit; the message says which."""


@dataclass(frozen=True)
class FileLimits:
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_store_bytes: int = DEFAULT_MAX_STORE_BYTES  # all files of all tenants together

    def __post_init__(self) -> None:
        if self.max_file_bytes < 1 or self.max_store_bytes < self.max_file_bytes:
            raise ValueError("--files-max-bytes must be positive and at most --files-store-max-bytes")


@dataclass
class FileRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None

    def as_object(self) -> dict[str, Any]:
        """OpenAI's `file` object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


class _Blobs:
    """Where the bytes are: a folder, or a dict (in-memory mode)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.memory: dict[str, bytes] = {}
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def spool(self) -> IO[bytes]:
        if self.folder is None:
            return tempfile.SpooledTemporaryFile(max_size=1 << 62)  # never rolls over: memory only
        return tempfile.NamedTemporaryFile(dir=self.folder, prefix=".upload-", delete=False)

    def keep(self, file_id: str, spooled: IO[bytes]) -> None:
        if self.folder is None:
            spooled.seek(0)
            self.memory[file_id] = spooled.read()
            spooled.close()
        else:
            spooled.close()
            os.replace(spooled.name, self.folder / file_id)

    def drop_spool(self, spooled: IO[bytes]) -> None:
        spooled.close()
        if self.folder is not None:
            Path(spooled.name).unlink(missing_ok=True)

    def read(self, file_id: str) -> bytes:
        if self.folder is None:
            return self.memory[file_id]
        return (self.folder / file_id).read_bytes()

    def delete(self, file_id: str) -> None:
        if self.folder is None:
            self.memory.pop(file_id, None)
        else:
            (self.folder / file_id).unlink(missing_ok=True)

    def sweep_spools(self) -> None:
        """Uploads cut by a crash leave temporary files: gone at start."""
        if self.folder is not None:
            for leftover in self.folder.glob(".upload-*"):
                leftover.unlink(missing_ok=True)


class Upload:
    """An upload as it streams: `write` each piece (TooLarge past a limit), then `commit` or `abort`
    (an upload neither committed nor aborted is aborted when closed)."""

    def __init__(self, store: FileStore, spooled: IO[bytes]) -> None:
        self.store, self.spooled, self.written, self.open = store, spooled, 0, True

    def write(self, piece: bytes) -> None:
        self.written += len(piece)
        self.store._check_room(self.written)
        self.spooled.write(piece)

    def commit(self, owner: str, filename: str, purpose: str, expires_after_s: int | None) -> FileRecord:
        self.open = False
        return self.store._commit(self, owner, filename, purpose, expires_after_s)

    def abort(self) -> None:
        if self.open:
            self.open = False
            self.store._blobs.drop_spool(self.spooled)


class FileStore:
    def __init__(self, store_dir: str, limits: FileLimits = FileLimits()) -> None:
        """`store_dir`: the Responses store's folder (the files go in a folder of their own), or IN_MEMORY."""
        memory = store_dir == IN_MEMORY
        self.limits = limits
        self._blobs = _Blobs(None if memory else Path(store_dir) / FILES_FOLDER)
        self._blobs.sweep_spools()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(IN_MEMORY if memory else str(Path(store_dir) / FILES_DB),
                                   check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS files (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,"
            " owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,"
            " created_at INTEGER NOT NULL, expires_at INTEGER)")

    # ---------------------------------------------------------------- uploads

    def begin_upload(self) -> Upload:
        return Upload(self, self._blobs.spool())

    def _commit(self, upload: Upload, owner: str, filename: str, purpose: str,
                expires_after_s: int | None) -> FileRecord:
        file_id = new_id("file")
        self._blobs.keep(file_id, upload.spooled)
        now = int(time.time())
        record = FileRecord(file_id, owner, filename, purpose, upload.written, now,
                            None if expires_after_s is None else now + expires_after_s)
        with self._lock:
            self._db.execute("INSERT INTO files (id, owner, filename, purpose, bytes, created_at, expires_at)"
                             " VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (record.id, owner, filename, purpose, upload.written, now, record.expires_at))
        return record

    def _check_room(self, written: int) -> None:
        if written > self.limits.max_file_bytes:
            raise TooLarge(f"The file is larger than this server's limit of {self.limits.max_file_bytes} bytes "
                           "per file.")
        if self.used_bytes() + written > self.limits.max_store_bytes:
            raise TooLarge(f"The server's file storage is full ({self.limits.max_store_bytes} bytes): delete "
                           "files first.")

    def used_bytes(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files").fetchone()[0]

    # ---------------------------------------------------------------- reads

    def get(self, owner: str, file_id: str) -> FileRecord | None:
        self._expire()
        with self._lock:
            row = self._db.execute("SELECT id, owner, filename, purpose, bytes, created_at, expires_at FROM files"
                                   " WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
        return None if row is None else FileRecord(*row)

    def content(self, owner: str, file_id: str) -> bytes | None:
        return None if self.get(owner, file_id) is None else self._blobs.read(file_id)

    def list(self, owner: str, purpose: str | None, after: str | None, limit: int,
             order: str) -> tuple[list[FileRecord], bool]:
        """A page of the owner's files (newest first with order desc), and whether more follow.
        `after` must be one of the owner's files (else no page: None is refused by the route)."""
        self._expire()
        sign, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        query = "SELECT id, owner, filename, purpose, bytes, created_at, expires_at FROM files WHERE owner = ?"
        args: list[Any] = [owner]
        if purpose is not None:
            query += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            query += f" AND seq {sign} (SELECT seq FROM files WHERE id = ? AND owner = ?)"
            args += [after, owner]
        query += f" ORDER BY seq {direction} LIMIT ?"
        args.append(limit + 1)
        with self._lock:
            rows = [FileRecord(*row) for row in self._db.execute(query, args).fetchall()]
        return rows[:limit], len(rows) > limit

    # ---------------------------------------------------------------- deletes

    def delete(self, owner: str, file_id: str) -> bool:
        with self._lock:
            gone = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner)).rowcount > 0
        if gone:
            self._blobs.delete(file_id)
        return gone

    def _expire(self) -> None:
        """Files past their `expires_after` are deleted when next looked at."""
        with self._lock:
            ids = [r[0] for r in self._db.execute("SELECT id FROM files WHERE expires_at IS NOT NULL AND "
                                                  "expires_at <= ?", (int(time.time()),)).fetchall()]
            self._db.execute("DELETE FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?",
                             (int(time.time()),))
        for file_id in ids:
            self._blobs.delete(file_id)
