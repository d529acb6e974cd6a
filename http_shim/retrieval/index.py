"""Each store's vectors packed in one float32 matrix in memory, searched exactly (a matrix-vector product
and a partial sort): 100k chunks of 384 dimensions answer in ~3 ms on one core, no index to tune and
nothing approximate (benchmarks/RESULTS.md, "Retrieval"; sqlite-vec cannot load here: Python's sqlite3
is built without extension loading). A store's matrix is read from the catalog at its first search and
kept; a finished file is appended, a removed file or a deleted store drops it (read again when needed).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .catalog import Catalog


@dataclass
class _Packed:
    ids: np.ndarray  # chunk ids, one per row
    vectors: np.ndarray  # rows: unit vectors
    file_codes: np.ndarray  # each row's file, as its place in `files` (a filter is then one np.isin)
    files: list[str]

    @classmethod
    def of(cls, ids: np.ndarray, vectors: np.ndarray, file_ids: list[str]) -> _Packed:
        files = list(dict.fromkeys(file_ids))
        code = {f: k for k, f in enumerate(files)}
        return cls(ids, vectors, np.fromiter((code[f] for f in file_ids), np.int32, len(file_ids)), files)


class VectorIndex:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._packed: dict[str, _Packed] = {}
        self._lock = threading.Lock()

    def _load(self, store_id: str) -> _Packed:
        with self._lock:
            packed = self._packed.get(store_id)
        if packed is None:
            ids, vectors, file_ids = self._catalog.vectors(store_id)
            packed = _Packed.of(ids, vectors, file_ids)
            with self._lock:
                self._packed.setdefault(store_id, packed)
        return packed

    def add(self, store_id: str, ids: list[int], vectors: np.ndarray, file_id: str) -> None:
        """A finished file's chunks (only where the store is loaded: else its first search reads them)."""
        with self._lock:
            packed = self._packed.get(store_id)
            if packed is None or not ids:
                return
            rows = vectors.astype(np.float32)
            files = packed.files if file_id in packed.files else [*packed.files, file_id]
            codes = np.full(len(ids), files.index(file_id), np.int32)
            self._packed[store_id] = _Packed(
                np.concatenate([packed.ids, np.array(ids, np.int64)]),
                rows if packed.vectors.size == 0 else np.vstack([packed.vectors, rows]),
                np.concatenate([packed.file_codes, codes]), files)

    def forget(self, store_id: str) -> None:
        with self._lock:
            self._packed.pop(store_id, None)

    def nearest(self, store_id: str, queries: np.ndarray, allowed_files: set[str] | None,
                limit: int) -> list[tuple[int, float]]:
        """(chunk id, cosine) of the `limit` nearest chunks to any of the queries (each chunk its best),
        best first; `allowed_files`: only chunks of these files (None: any)."""
        packed = self._load(store_id)
        if packed.vectors.size == 0 or queries.shape[1] != packed.vectors.shape[1]:
            return []
        scores = (packed.vectors @ queries.T).max(axis=1)
        if allowed_files is not None:
            allowed = [k for k, f in enumerate(packed.files) if f in allowed_files]
            mask = np.isin(packed.file_codes, np.array(allowed, np.int32))
            scores = np.where(mask, scores, -np.inf)
        limit = min(limit, len(scores))
        top = np.argpartition(-scores, limit - 1)[:limit]
        top = top[np.argsort(-scores[top])]
        return [(int(packed.ids[k]), float(scores[k])) for k in top if np.isfinite(scores[k])]

