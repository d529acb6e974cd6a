"""Search over one or more vector stores: the queries' vectors against each store's chunks (index.py),
the chunks' words against the queries' (SQLite FTS5, BM25), fused by weighted reciprocal rank (RRF, as
OpenAI's `ranking_options.hybrid_search` names it), limited to the files whose attributes pass the
filter. A result's score is its fused value over the best possible one (first in both rankings: 1.0),
so scores fall as results go down the page; `ranker: "none"` ranks by the vectors alone and scores by
cosine similarity to the nearest query, clamped to [0, 1]. `score_threshold` applies to the score shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .catalog import Catalog, StoreFile
from .embedder import Embedder
from .filters import matches
from .index import VectorIndex

RRF_K = 60  # the constant of reciprocal rank fusion (Cormack et al.; Elasticsearch's and OGX's default)
DEFAULT_EMBEDDING_WEIGHT, DEFAULT_TEXT_WEIGHT = 1.0, 0.5
CANDIDATES = 100  # per ranking, before fusion


@dataclass(frozen=True)
class SearchOptions:
    queries: list[str]
    filters: dict[str, Any] | None = None
    max_num_results: int = 10
    score_threshold: float = 0.0
    ranker: str = "auto"
    embedding_weight: float = DEFAULT_EMBEDDING_WEIGHT
    text_weight: float = DEFAULT_TEXT_WEIGHT

    @classmethod
    def of(cls, queries: list[str], filters: dict | None, max_num_results: int, ranking: Any) -> SearchOptions:
        """From a request's fields (`ranking`: its RankingOptions, or None)."""
        hybrid = ranking.hybrid_search if ranking is not None else None
        return cls(queries, filters, max_num_results,
                   (ranking.score_threshold or 0.0) if ranking is not None else 0.0,
                   (ranking.ranker or "auto") if ranking is not None else "auto",
                   hybrid.embedding_weight if hybrid else DEFAULT_EMBEDDING_WEIGHT,
                   hybrid.text_weight if hybrid else DEFAULT_TEXT_WEIGHT)


@dataclass(frozen=True)
class Hit:
    file: StoreFile
    text: str
    score: float

    def as_result(self) -> dict[str, Any]:
        """OpenAI's search result (a page's `data` item)."""
        return {"file_id": self.file.file_id, "filename": self.file.filename, "score": round(self.score, 6),
                "attributes": self.file.attributes, "content": [{"type": "text", "text": self.text}]}


def search(catalog: Catalog, index: VectorIndex, embedder: Embedder, store_ids: list[str],
           options: SearchOptions, request_id: str) -> list[Hit]:
    files = catalog.files_of(store_ids)
    allowed = None
    if options.filters is not None:
        allowed = {f for (_, f), record in files.items() if matches(record.attributes, options.filters)}
        if not allowed:
            return []
    queries = embedder.embed(options.queries, request_id)
    cosine: dict[int, float] = {}
    vector_rank: list[int] = []
    for store_id in store_ids:
        for chunk_id, score in index.nearest(store_id, queries, allowed, CANDIDATES):
            cosine[chunk_id] = score
    vector_rank = sorted(cosine, key=cosine.__getitem__, reverse=True)
    fused = {chunk_id: options.embedding_weight / (RRF_K + k + 1) for k, chunk_id in enumerate(vector_rank)}
    if options.ranker != "none" and options.text_weight > 0:
        words = catalog.keyword_hits(store_ids, " ".join(options.queries), CANDIDATES * 2)
        chunks = catalog.chunks(words)
        words = [c for c in words if c in chunks and (allowed is None or chunks[c][1] in allowed)][:CANDIDATES]
        for k, chunk_id in enumerate(words):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + options.text_weight / (RRF_K + k + 1)
    order = sorted(fused, key=lambda c: (-fused[c], -cosine.get(c, 0.0)))
    best = (options.embedding_weight + (options.text_weight if options.ranker != "none" else 0.0)) / (RRF_K + 1)
    texts = catalog.chunks(order[: options.max_num_results * 3])
    hits = []
    for chunk_id in order:
        if chunk_id not in texts or len(hits) == options.max_num_results:
            continue
        store_id, file_id, text = texts[chunk_id]
        if options.ranker == "none":
            score = min(1.0, max(0.0, cosine.get(chunk_id, 0.0)))
        else:
            score = fused[chunk_id] / best if best > 0 else 0.0
        if score >= options.score_threshold and (store_id, file_id) in files:
            hits.append(Hit(files[(store_id, file_id)], text, score))
    return hits
