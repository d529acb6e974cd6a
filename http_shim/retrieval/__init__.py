"""Vector stores and search (/v1/vector_stores) over the Files API's files, on Conduit's own embedding
model, and what the Responses API's `file_search` tool searches with (docs/retrieval.md).

extract.py reads a file's text, chunking.py cuts it in the embedding model's tokens, embedder.py embeds
through its engine, ingest.py does that in the background, catalog.py keeps stores, files and chunks in
SQLite (FTS5 for words), index.py searches vectors exactly, filters.py applies attribute filters,
search.py fuses vector and keyword ranks, protocol.py types the requests, routes.py serves them.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask

from ..files import FileStore
from ..models import ServedModels
from .catalog import Catalog
from .embedder import DEFAULT_RETRIEVAL_MODEL, Embedder
from .index import VectorIndex
from .ingest import Ingestor
from .routes import RetrievalRoutes, register_vector_stores

__all__ = ["DEFAULT_RETRIEVAL_MODEL", "Retrieval", "open_retrieval"]


@dataclass
class Retrieval:
    """Everything a search needs, shared by the vector store routes and the Responses API's file_search."""

    catalog: Catalog
    index: VectorIndex
    embedder: Embedder
    ingestor: Ingestor


def open_retrieval(app: Flask, store_dir: str, files: FileStore, models: ServedModels, model: str) -> Retrieval:
    """The catalog beside the other stores, ingestion started (resuming what a stop interrupted), the
    routes registered."""
    catalog = Catalog(store_dir)
    index = VectorIndex(catalog)
    embedder = Embedder(models, model)
    ingestor = Ingestor(catalog, index, files, embedder)
    register_vector_stores(app, RetrievalRoutes(catalog, index, files, embedder, ingestor))
    ingestor.start()
    return Retrieval(catalog, index, embedder, ingestor)
