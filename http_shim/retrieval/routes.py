"""/v1/vector_stores: stores, their files, file batches and search, each within the caller's tenant
(auth.tenant): another key's store, file or batch is a 404 and never in a list."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, request

from ..auth import tenant
from ..errors import APIError
from ..files import FileStore, file_not_found
from ..protocol.base import parse
from ..protocol.listing import ListQuery, page, query_values
from ..web import json_response, read_body, request_id
from .catalog import Catalog
from .index import VectorIndex
from .ingest import Ingestor
from .protocol import (BatchFile, FileBatchCreate, SearchRequest, StoreFileCreate, StoreFileListQuery,
                       StoreFileUpdate, VectorStoreCreate, VectorStoreUpdate)
from .search import SearchOptions, search
from .embedder import Embedder

STORES_ROUTE = "/v1/vector_stores"
AUTO_CHUNKING = {"type": "auto"}


def store_not_found(store_id: str) -> APIError:
    return APIError(404, f"No vector store found with id '{store_id}'.", "invalid_request_error",
                    "vector_store_id", None)


def store_expired(store_id: str, param: str) -> APIError:
    """A store past its `expires_after`: kept (its files can be read), no longer searched."""
    return APIError(400, f"Vector store '{store_id}' has expired (expires_after); create another or update its "
                    "expires_after.", "invalid_request_error", param, "vector_store_expired")


class RetrievalRoutes:
    def __init__(self, catalog: Catalog, index: VectorIndex, files: FileStore, embedder: Embedder,
                 ingestor: Ingestor) -> None:
        self.catalog, self.index, self.files, self.embedder, self.ingestor = catalog, index, files, embedder, ingestor

    # ---------------------------------------------------------------- helpers

    def _store(self, store_id: str) -> dict[str, Any]:
        found = self.catalog.store(tenant(), store_id)
        if found is None:
            raise store_not_found(store_id)
        return found

    def _add_files(self, store_id: str, entries: list[BatchFile], batch_id: str | None, param: str) -> None:
        """Files join the store (each must be the caller's) and are queued for ingestion; an unknown file
        refuses the whole request before any is added."""
        owner = tenant()
        records = []
        for k, entry in enumerate(entries):
            record = self.files.get(owner, entry.file_id)
            if record is None:
                raise file_not_found(entry.file_id, f"{param}[{k}]" if param.endswith("s") else param)
            records.append(record)
        for entry, record in zip(entries, records):
            chunking = (entry.chunking_strategy.model_dump() if entry.chunking_strategy is not None
                        else AUTO_CHUNKING)
            self.catalog.add_file(owner, store_id, record.id, record.filename, entry.attributes or {}, chunking,
                                  batch_id)
            self.index.forget(store_id)  # a file added again: its old chunks went
            self.ingestor.submit(store_id, record.id, owner)
        self.catalog.touch(store_id)

    # ---------------------------------------------------------------- stores

    def create_store(self) -> Response:
        body = parse(VectorStoreCreate, read_body())
        # Built from fields validated already: a chunking strategy's model is not its JSON form again.
        entries = [BatchFile.model_construct(file_id=f, chunking_strategy=body.chunking_strategy)
                   for f in body.file_ids or []]
        for k, entry in enumerate(entries):  # checked before the store exists
            if self.files.get(tenant(), entry.file_id) is None:
                raise file_not_found(entry.file_id, f"file_ids[{k}]")
        store_id = self.catalog.create_store(tenant(), body.name or "", body.metadata or {},
                                             body.expires_after and body.expires_after.model_dump(), body.description)
        self._add_files(store_id, entries, None, "file_ids")
        return json_response(self._store(store_id))

    def list_stores(self) -> Response:
        query = parse(ListQuery, query_values(request.args))
        stores, more = self.catalog.list_stores(tenant(), query.after, query.limit, query.order)
        return json_response(page(stores, more))

    def retrieve_store(self, store_id: str) -> Response:
        return json_response(self._store(store_id))

    def update_store(self, store_id: str) -> Response:
        self._store(store_id)
        body = parse(VectorStoreUpdate, read_body())
        fields = {name: value for name, value in body.model_dump(exclude_unset=True).items() if value is not None}
        self.catalog.update_store(tenant(), store_id, fields)
        return json_response(self._store(store_id))

    def delete_store(self, store_id: str) -> Response:
        if not self.catalog.delete_store(tenant(), store_id):
            raise store_not_found(store_id)
        self.index.forget(store_id)
        return json_response({"id": store_id, "object": "vector_store.deleted", "deleted": True})

    # ---------------------------------------------------------------- files of a store

    def _store_file(self, store_id: str, file_id: str):
        self._store(store_id)
        found = self.catalog.store_file(tenant(), store_id, file_id)
        if found is None:
            raise APIError(404, f"No file found with id '{file_id}' in vector store '{store_id}'.",
                           "invalid_request_error", "file_id", None)
        return found

    def add_file(self, store_id: str) -> Response:
        self._store(store_id)
        body = parse(StoreFileCreate, read_body())
        self._add_files(store_id, [BatchFile(**body.model_dump(exclude_none=True))], None, "file_id")
        return json_response(self.catalog.store_file(tenant(), store_id, body.file_id).as_object())

    def list_files(self, store_id: str) -> Response:
        self._store(store_id)
        query = parse(StoreFileListQuery, query_values(request.args))
        files, more = self.catalog.list_files(tenant(), store_id, query.after, query.limit, query.order, query.filter)
        return json_response(page([f.as_object() for f in files], more))

    def retrieve_file(self, store_id: str, file_id: str) -> Response:
        return json_response(self._store_file(store_id, file_id).as_object())

    def update_file(self, store_id: str, file_id: str) -> Response:
        self._store_file(store_id, file_id)
        body = parse(StoreFileUpdate, read_body())
        self.catalog.set_attributes(tenant(), store_id, file_id, body.attributes or {})
        return json_response(self._store_file(store_id, file_id).as_object())

    def remove_file(self, store_id: str, file_id: str) -> Response:
        self._store_file(store_id, file_id)
        self.catalog.remove_file(tenant(), store_id, file_id)
        self.index.forget(store_id)
        return json_response({"id": file_id, "object": "vector_store.file.deleted", "deleted": True})

    def file_content(self, store_id: str, file_id: str) -> Response:
        found = self._store_file(store_id, file_id)
        text = self.catalog.file_text(tenant(), store_id, file_id)
        data = [{"type": "text", "text": text}] if text else []
        return json_response({"object": "vector_store.file_content.page", "data": data, "has_more": False,
                              "next_page": None, "file_id": file_id, "filename": found.filename})

    # ---------------------------------------------------------------- batches

    def _batch(self, store_id: str, batch_id: str) -> dict[str, Any]:
        self._store(store_id)
        found = self.catalog.batch(tenant(), store_id, batch_id)
        if found is None:
            raise APIError(404, f"No file batch found with id '{batch_id}'.", "invalid_request_error", "batch_id",
                           None)
        return found

    def create_batch(self, store_id: str) -> Response:
        self._store(store_id)
        body = parse(FileBatchCreate, read_body())
        entries = body.entries()
        for k, entry in enumerate(entries):  # every file checked before the batch exists
            if self.files.get(tenant(), entry.file_id) is None:
                raise file_not_found(entry.file_id, f"file_ids[{k}]" if body.file_ids else f"files[{k}].file_id")
        batch_id = self.catalog.create_batch(tenant(), store_id)
        self._add_files(store_id, entries, batch_id, "file_ids")
        return json_response(self._batch(store_id, batch_id))

    def retrieve_batch(self, store_id: str, batch_id: str) -> Response:
        return json_response(self._batch(store_id, batch_id))

    def cancel_batch(self, store_id: str, batch_id: str) -> Response:
        self._batch(store_id, batch_id)
        self.catalog.cancel_batch(tenant(), store_id, batch_id)
        return json_response(self._batch(store_id, batch_id))

    def batch_files(self, store_id: str, batch_id: str) -> Response:
        self._batch(store_id, batch_id)
        query = parse(StoreFileListQuery, query_values(request.args))
        files, more = self.catalog.list_files(tenant(), store_id, query.after, query.limit, query.order,
                                              query.filter, batch_id)
        return json_response(page([f.as_object() for f in files], more))

    # ---------------------------------------------------------------- search

    def search(self, store_id: str) -> Response:
        if self._store(store_id)["status"] == "expired":
            raise store_expired(store_id, "vector_store_id")
        body = parse(SearchRequest, read_body())
        options = SearchOptions.of(body.queries(), body.filters, body.max_num_results, body.ranking_options)
        self.catalog.touch(store_id)
        hits = search(self.catalog, self.index, self.embedder, [store_id], options, request_id())
        return json_response({"object": "vector_store.search_results.page", "search_query": body.queries(),
                              "data": [h.as_result() for h in hits], "has_more": False, "next_page": None})


def register_vector_stores(app: Flask, routes: RetrievalRoutes) -> None:
    one = STORES_ROUTE + "/<store_id>"
    files, batches = one + "/files", one + "/file_batches"
    table = [
        ("POST", STORES_ROUTE, routes.create_store), ("GET", STORES_ROUTE, routes.list_stores),
        ("GET", one, routes.retrieve_store), ("POST", one, routes.update_store), ("DELETE", one, routes.delete_store),
        ("POST", one + "/search", routes.search),
        ("POST", files, routes.add_file), ("GET", files, routes.list_files),
        ("GET", files + "/<file_id>", routes.retrieve_file), ("POST", files + "/<file_id>", routes.update_file),
        ("DELETE", files + "/<file_id>", routes.remove_file),
        ("GET", files + "/<file_id>/content", routes.file_content),
        ("POST", batches, routes.create_batch), ("GET", batches + "/<batch_id>", routes.retrieve_batch),
        ("POST", batches + "/<batch_id>/cancel", routes.cancel_batch),
        ("GET", batches + "/<batch_id>/files", routes.batch_files),
    ]
    for method, rule, view in table:  # endpoints named apart from the Files API's views
        app.add_url_rule(rule, f"vector_stores.{view.__name__}", view, methods=[method])
