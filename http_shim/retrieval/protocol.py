"""The vector store API's requests, typed (validation, and their part of /openapi.json): stores, their
files and file batches, search with attribute filters and ranking options, chunking strategies.
OpenAI's bounds throughout (the openai SDK's `types.vector_stores` and `vector_store_search_params`)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, PlainValidator, WithJsonSchema, model_validator

from ..protocol.base import ApiModel, Bool, NonEmptyStr, Str, by_type, fail, got, int_in, is_number, number_in, \
    one_of
from ..protocol.openapi import ApiPart, Operation, answers, error_responses
from ..protocol.metadata import Metadata
from conduit.v1.contract import Range

MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 100, 4096  # OpenAI's bounds on a static strategy
MAX_BATCH_FILES = 2000
MAX_RESULTS = 50
ATTRIBUTES_MAX_KEYS, ATTRIBUTE_KEY_CHARS, ATTRIBUTE_VALUE_CHARS = 16, 64, 512
MAX_FILTER_DEPTH = 8
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")


# ------------------------------------------------------------------ attributes and filters

def _attributes(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail("'{param}' must be an object.")
    if len(value) > ATTRIBUTES_MAX_KEYS:
        raise fail("'{param}' may hold at most {cap} keys, got {got}.", cap=ATTRIBUTES_MAX_KEYS, got=len(value))
    for key, item in value.items():
        if len(key) > ATTRIBUTE_KEY_CHARS:
            raise fail("'{param}' keys may be at most {cap} characters.", cap=ATTRIBUTE_KEY_CHARS)
        if isinstance(item, str) and len(item) > ATTRIBUTE_VALUE_CHARS:
            raise fail("'{param}' string values may be at most {cap} characters.", cap=ATTRIBUTE_VALUE_CHARS)
        if not (isinstance(item, (str, bool)) or is_number(item)):
            raise fail("'{param}' values must be strings, numbers or booleans; {key} is {got}.",
                       key=got(key), got=got(item))
    return value


Attributes = Annotated[dict[str, Any], PlainValidator(_attributes), WithJsonSchema({
    "type": "object", "maxProperties": ATTRIBUTES_MAX_KEYS,
    "additionalProperties": {"oneOf": [{"type": "string", "maxLength": ATTRIBUTE_VALUE_CHARS},
                                       {"type": "number"}, {"type": "boolean"}]}})]


def _filter(value: Any, depth: int = 0) -> dict[str, Any]:
    """A comparison {key, type, value} or a compound {type: and|or, filters: [...]}, checked whole."""
    if not isinstance(value, dict):
        raise fail("'{param}' must be a filter object, got {got}.", got=got(value))
    kind = value.get("type")
    if kind in ("and", "or"):
        filters = value.get("filters")
        if not isinstance(filters, list) or not filters:
            raise fail("'{param}': an '{kind}' filter needs a non-empty 'filters' array.", kind=kind)
        if depth >= MAX_FILTER_DEPTH:
            raise fail("'{param}' nests filters deeper than {cap}.", cap=MAX_FILTER_DEPTH)
        return {"type": kind, "filters": [_filter(f, depth + 1) for f in filters]}
    if kind not in COMPARISONS:
        raise fail("'{param}.type' must be one of " + ", ".join(COMPARISONS + ("and", "or")) + "; got {got}.",
                   got=got(kind))
    key, operand = value.get("key"), value.get("value")
    if not isinstance(key, str) or not key:
        raise fail("'{param}.key' must be a non-empty string.")
    scalar = isinstance(operand, (str, bool)) or is_number(operand)
    if kind in ("in", "nin"):
        if not isinstance(operand, list) or not all(isinstance(v, str) or is_number(v) for v in operand):
            raise fail("'{param}.value' of an '{kind}' filter must be an array of strings or numbers.", kind=kind)
    elif not scalar:
        raise fail("'{param}.value' must be a string, number or boolean, got {got}.", got=got(operand))
    elif kind in ("gt", "gte", "lt", "lte") and isinstance(operand, bool):
        raise fail("'{param}.value' of a '{kind}' filter must be a number or string.", kind=kind)
    return {"type": kind, "key": key, "value": operand}


Filter = Annotated[dict[str, Any], PlainValidator(_filter), WithJsonSchema({
    "type": "object", "description": "a comparison {key, type: eq|ne|gt|gte|lt|lte|in|nin, value} or a compound "
                                     "{type: and|or, filters}"})]


# ------------------------------------------------------------------ chunking

class AutoChunking(ApiModel):
    type: one_of("auto")


class StaticSizes(ApiModel):
    max_chunk_size_tokens: int_in(MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS)
    chunk_overlap_tokens: int_in(0, MAX_CHUNK_TOKENS // 2)

    @model_validator(mode="after")
    def _overlap_at_most_half(self) -> StaticSizes:
        if self.chunk_overlap_tokens > self.max_chunk_size_tokens // 2:
            raise fail("'{param}' must not exceed half of 'max_chunk_size_tokens' ({cap}).",
                       field="chunk_overlap_tokens", cap=self.max_chunk_size_tokens // 2)
        return self


class StaticChunking(ApiModel):
    type: one_of("static")
    static: StaticSizes


class _Unknown(ApiModel):
    type: Any = None

    @model_validator(mode="after")
    def _refuse(self) -> _Unknown:
        raise fail("'{param}' must be 'auto' or 'static', got {got}.", field="type", got=got(self.type))


ChunkingStrategy = by_type({"auto": AutoChunking, "static": StaticChunking}, _Unknown)


# ------------------------------------------------------------------ stores, files, batches

class StoreExpiry(ApiModel):
    anchor: one_of("last_active_at")
    days: int_in(1, 365)


class VectorStoreCreate(ApiModel):
    """POST /v1/vector_stores."""

    name: Str | None = None
    description: Str | None = None
    file_ids: Annotated[list[NonEmptyStr], Field(max_length=MAX_BATCH_FILES)] | None = None
    metadata: Metadata | None = None
    expires_after: StoreExpiry | None = None
    chunking_strategy: ChunkingStrategy | None = None


class VectorStoreUpdate(ApiModel):
    """POST /v1/vector_stores/{id}."""

    name: Str | None = None
    metadata: Metadata | None = None
    expires_after: StoreExpiry | None = None


class StoreFileCreate(ApiModel):
    """POST /v1/vector_stores/{id}/files."""

    file_id: NonEmptyStr
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class StoreFileUpdate(ApiModel):
    """POST /v1/vector_stores/{id}/files/{file_id}: new attributes."""

    attributes: Attributes | None


class BatchFile(ApiModel):
    file_id: NonEmptyStr
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None


class FileBatchCreate(ApiModel):
    """POST /v1/vector_stores/{id}/file_batches: `file_ids` (with shared attributes and chunking) or
    `files` (each its own)."""

    file_ids: Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_BATCH_FILES)] | None = None
    files: Annotated[list[BatchFile], Field(min_length=1, max_length=MAX_BATCH_FILES)] | None = None
    attributes: Attributes | None = None
    chunking_strategy: ChunkingStrategy | None = None

    @model_validator(mode="after")
    def _one_list(self) -> FileBatchCreate:
        if (self.file_ids is None) == (self.files is None):
            raise fail("Give either 'file_ids' or 'files' (not both).", field="file_ids")
        return self

    def entries(self) -> list[BatchFile]:
        if self.files is not None:
            return list(self.files)
        return [BatchFile.model_construct(file_id=f, attributes=self.attributes,  # fields validated already
                                          chunking_strategy=self.chunking_strategy) for f in self.file_ids or []]


class HybridWeights(ApiModel):
    embedding_weight: number_in(Range(0.0, 1e6))
    text_weight: number_in(Range(0.0, 1e6))


class RankingOptions(ApiModel):
    ranker: one_of("none", "auto", "default-2024-11-15") | None = None
    score_threshold: number_in(Range(0.0, 1.0)) | None = None
    hybrid_search: HybridWeights | None = None


def _query(value: Any) -> str | list[str]:
    queries = [value] if isinstance(value, str) else value
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
        raise fail("'{param}' must be a string or a non-empty array of strings.")
    if not all(q.strip() for q in queries):
        raise fail("'{param}' must not be empty.")
    if len(queries) > 10:
        raise fail("'{param}' may hold at most 10 queries.")
    return value


Query = Annotated[Union[str, list[str]], PlainValidator(_query), WithJsonSchema({
    "oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "maxItems": 10}]})]


class SearchRequest(ApiModel):
    """POST /v1/vector_stores/{id}/search."""

    query: Query
    filters: Filter | None = None
    max_num_results: int_in(1, MAX_RESULTS) = 10
    ranking_options: RankingOptions | None = None
    rewrite_query: Bool | None = None  # accepted; queries are searched as written

    def queries(self) -> list[str]:
        return [self.query] if isinstance(self.query, str) else list(self.query)


class StoreFileListQuery(ApiModel):
    after: Str | None = None
    limit: int_in(1, 100) = 20
    order: one_of("asc", "desc") = "desc"
    filter: one_of("in_progress", "completed", "failed", "cancelled") | None = None


# ------------------------------------------------------------------ /openapi.json

_STORE_ID = {"name": "vector_store_id", "in": "path", "required": True, "schema": {"type": "string"}}
_FILE_ID = {"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}
_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
_LIST = [{"name": n, "in": "query", "schema": {"type": "string"}} for n in ("after", "limit", "order")]


def _get(summary: str, answer: str, *parameters: dict) -> dict[str, Any]:
    return {"summary": summary, "parameters": list(parameters), "responses": answers(answer, error_responses(
        400, 401, 404))}


_OBJECT = {"type": "object"}
_STORES = "/v1/vector_stores"

RETRIEVAL_API = ApiPart(
    operations=[
        Operation(_STORES, "Create a vector store", VectorStoreCreate, "VectorStore"),
        Operation(_STORES + "/{vector_store_id}", "Update a vector store", VectorStoreUpdate, "VectorStore",
                  parameters=[_STORE_ID]),
        Operation(_STORES + "/{vector_store_id}/files", "Add a file (ingested in the background)",
                  StoreFileCreate, "VectorStoreFile", parameters=[_STORE_ID]),
        Operation(_STORES + "/{vector_store_id}/files/{file_id}", "Update a file's attributes", StoreFileUpdate,
                  "VectorStoreFile", parameters=[_STORE_ID, _FILE_ID]),
        Operation(_STORES + "/{vector_store_id}/file_batches", "Add files (ingested in the background)",
                  FileBatchCreate, "VectorStoreFileBatch", parameters=[_STORE_ID]),
        Operation(_STORES + "/{vector_store_id}/search", "Search a vector store", SearchRequest,
                  "VectorStoreSearchPage", parameters=[_STORE_ID]),
    ],
    paths={},  # the GET and DELETE items join the operations' path items in openapi_document
    schemas={name: _OBJECT for name in ("VectorStore", "VectorStoreFile", "VectorStoreFileBatch",
                                        "VectorStoreSearchPage", "VectorStoreList", "VectorStoreFileContent")},
)
# Bodiless routes, merged into the path items above (a path item holds post, get and delete together).
RETRIEVAL_BODILESS = {
    _STORES: {"get": _get("This key's vector stores", "VectorStoreList", *_LIST)},
    _STORES + "/{vector_store_id}": {
        "get": _get("A vector store", "VectorStore", _STORE_ID),
        "delete": _get("Delete a vector store (its chunks with it; the files stay)", "VectorStore", _STORE_ID)},
    _STORES + "/{vector_store_id}/files": {"get": _get("A store's files (filter: a status)", "VectorStoreList",
                                                       _STORE_ID, *_LIST)},
    _STORES + "/{vector_store_id}/files/{file_id}": {
        "get": _get("A store's file", "VectorStoreFile", _STORE_ID, _FILE_ID),
        "delete": _get("Remove a file from a store (the file stays)", "VectorStoreFile", _STORE_ID, _FILE_ID)},
    _STORES + "/{vector_store_id}/files/{file_id}/content": {
        "get": _get("A store file's parsed text", "VectorStoreFileContent", _STORE_ID, _FILE_ID)},
    _STORES + "/{vector_store_id}/file_batches/{batch_id}": {
        "get": _get("A file batch", "VectorStoreFileBatch", _STORE_ID, _BATCH_ID)},
    _STORES + "/{vector_store_id}/file_batches/{batch_id}/cancel": {
        "post": _get("Cancel a file batch's files still waiting", "VectorStoreFileBatch", _STORE_ID, _BATCH_ID)},
    _STORES + "/{vector_store_id}/file_batches/{batch_id}/files": {
        "get": _get("A batch's files", "VectorStoreList", _STORE_ID, _BATCH_ID, *_LIST)},
}


# ------------------------------------------------------------------ the Responses API's file_search tool

class FileSearchTool(ApiModel):
    """`{"type": "file_search", "vector_store_ids", "max_num_results", "filters", "ranking_options"}` in a
    /v1/responses request's tools. Kept as sent for the echo (responses/protocol.py wraps it)."""

    type: one_of("file_search")
    vector_store_ids: Annotated[list[NonEmptyStr], Field(min_length=1, max_length=10)]
    max_num_results: int_in(1, MAX_RESULTS) | None = None
    filters: Filter | None = None
    ranking_options: RankingOptions | None = None
