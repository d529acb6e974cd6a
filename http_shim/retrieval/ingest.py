"""Background ingestion: a file added to a vector store waits `in_progress` until a worker greenlet has
read its text (extract.py), cut it into chunks of the embedding model's tokens (chunking.py), embedded
them and written them, with the file's `completed`, in one transaction (catalog.finish_file); or it is
`failed` with a `last_error`. A file removed, a store deleted or a batch cancelled meanwhile is dropped
(checked between embedding calls, and at the write). Files in progress at a start (the shim stopped
mid-way) are queued again: nothing stays in progress forever.
"""

from __future__ import annotations

import logging
import time

import gevent
import numpy as np
from gevent.queue import Queue

from ..errors import APIError
from ..files import FileStore
from ..live_generation import LIVE_GENERATION
from .catalog import Catalog
from .chunking import ChunkSizes, auto_sizes, chunk_text
from .embedder import EMBED_BATCH, Embedder
from .extract import InvalidFile, UnsupportedFile, extract_text
from .index import VectorIndex

log = logging.getLogger("http_shim.retrieval")
WORKERS = 2  # files ingested at once: one's text is cut while the other's chunks are embedded
# While chat streams run, ingestion embeds a few chunks at a time and then waits as long as that took: the
# embedding engine's work takes the chat engine's cores from it (engine_service/core/core_share.py), so
# without the pauses chat's inter-token gaps doubled for the whole ingestion (benchmarks/RESULTS.md).
PACED_CHUNKS = 16  # ~1 s of the embedding engine on its one thread, longer than core sharing's linger
PACED_WORK_SHARE = 0.5  # of the wall time, while any Generate call is open


def _in_thread(function, *args):
    """function(*args) on the hub's thread pool, its exception raised here (not printed by the pool)."""
    def run():
        try:
            return function(*args), None
        except Exception as error:  # handed back to the greenlet
            return None, error
    result, error = gevent.get_hub().threadpool.apply(run)
    if error is not None:
        raise error
    return result


class _Dropped(Exception):
    """The file left its store while it was ingested."""


class Ingestor:
    def __init__(self, catalog: Catalog, index: VectorIndex, files: FileStore, embedder: Embedder) -> None:
        self.catalog, self.index, self.files, self.embedder = catalog, index, files, embedder
        self._queue: Queue = Queue()
        self._workers: list[gevent.Greenlet] = []

    def start(self) -> None:
        """Workers up, and whatever a stop interrupted queued again."""
        for job in self.catalog.waiting():
            self._queue.put(job)
        self._workers = [gevent.spawn(self._work) for _ in range(WORKERS)]

    def stop(self) -> None:
        gevent.killall(self._workers, block=False)

    def submit(self, store_id: str, file_id: str, owner: str) -> None:
        self._queue.put((store_id, file_id, owner))

    def _work(self) -> None:
        while True:
            store_id, file_id, owner = self._queue.get()
            try:
                self.ingest(store_id, file_id, owner)
            except Exception:  # a bug: the file fails, the worker goes on
                log.exception("ingestion of %s into %s failed", file_id, store_id)
                self.catalog.fail_file(store_id, file_id, "server_error", "The file could not be processed.")

    def ingest(self, store_id: str, file_id: str, owner: str) -> None:
        if not self.catalog.still_wanted(store_id, file_id):
            return
        record = self.files.get(owner, file_id)
        content = self.files.content(owner, file_id) if record is not None else None
        if record is None or content is None:
            self.catalog.fail_file(store_id, file_id, "invalid_file", "The file was deleted before it was processed.")
            return
        request_id = f"ingest-{file_id}"
        try:
            # pypdf and the HTML parser are CPU work: a thread, so the shim's greenlets keep serving.
            text = _in_thread(extract_text, record.filename, content)
            chunking = self.catalog.store_file(owner, store_id, file_id)
            if chunking is None:
                return
            sizes = self._sizes(chunking.chunking, request_id)
            chunks = [c.text for c in chunk_text(text, sizes, lambda piece: self.embedder.tokens(piece, request_id))]
            vectors = self._embed(store_id, file_id, chunks, request_id)
        except UnsupportedFile as error:
            self.catalog.fail_file(store_id, file_id, "unsupported_file", str(error))
            return
        except InvalidFile as error:
            self.catalog.fail_file(store_id, file_id, "invalid_file", str(error))
            return
        except APIError as error:  # the embedding engine refused or is away
            self.catalog.fail_file(store_id, file_id, "server_error", error.message)
            return
        except _Dropped:
            return
        resolved = {"type": "static", "static": {"max_chunk_size_tokens": sizes.size,
                                                 "chunk_overlap_tokens": sizes.overlap}}
        ids = self.catalog.finish_file(store_id, file_id, text, chunks, vectors, resolved)
        if ids is not None:
            self.index.add(store_id, ids, vectors, file_id)
            log.info("ingested %s into %s: %d chunks", file_id, store_id, len(ids))

    def _sizes(self, chunking: dict, request_id: str) -> ChunkSizes:
        if chunking.get("type") == "static":
            static = chunking["static"]
            return ChunkSizes(static["max_chunk_size_tokens"], static["chunk_overlap_tokens"])
        return auto_sizes(self.embedder.window(request_id))

    def _embed(self, store_id: str, file_id: str, chunks: list[str], request_id: str) -> np.ndarray:
        parts = []
        start = 0
        while start < len(chunks):
            if not self.catalog.still_wanted(store_id, file_id):
                raise _Dropped()
            paced = LIVE_GENERATION.active()
            size = PACED_CHUNKS if paced else EMBED_BATCH * 4
            began = time.monotonic()
            parts.append(self.embedder.embed(chunks[start:start + size], request_id))
            start += size
            if paced and start < len(chunks):
                gevent.sleep((time.monotonic() - began) * (1 - PACED_WORK_SHARE) / PACED_WORK_SHARE)
        return np.vstack(parts) if parts else np.zeros((0, 0), np.float32)
