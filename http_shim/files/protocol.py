"""The Files API's inputs, typed: an upload's form fields and the list's query (validation, and the
/openapi.json part, come from these models). The bytes themselves stream (routes.py), never parsed here."""

from __future__ import annotations

from pydantic import Field

from ..protocol.base import ApiModel, NonEmptyStr, Str, int_in, one_of
from ..protocol.openapi import ApiPart, answers, error_responses
from .store import PURPOSES

EXPIRES_MIN_S, EXPIRES_MAX_S = 3600, 30 * 24 * 3600  # OpenAI's bounds on expires_after.seconds
MAX_FILES_PAGE = 10_000  # OpenAI lists up to 10,000 files a page


class ExpiresAfter(ApiModel):
    anchor: one_of("created_at")
    seconds: int_in(EXPIRES_MIN_S, EXPIRES_MAX_S)


class FileUpload(ApiModel):
    """POST /v1/files (multipart/form-data): `file` (its bytes and name), `purpose`, `expires_after`
    (sent by the openai SDK as expires_after[anchor] and expires_after[seconds])."""

    purpose: one_of(*PURPOSES)
    filename: NonEmptyStr = Field(description="the `file` part's filename")
    expires_after: ExpiresAfter | None = None


class FileListQuery(ApiModel):
    purpose: Str | None = None
    after: Str | None = None
    limit: int_in(1, MAX_FILES_PAGE) = MAX_FILES_PAGE
    order: one_of("asc", "desc") = "desc"


_FILE_ID = {"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}
_FILE_OBJECT = {"type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
                "properties": {"id": {"type": "string"}, "object": {"type": "string", "enum": ["file"]},
                               "bytes": {"type": "integer"}, "created_at": {"type": "integer"},
                               "filename": {"type": "string"}, "purpose": {"type": "string"},
                               "expires_at": {"type": "integer", "nullable": True}}}

FILES_API = ApiPart(
    paths={
        "/v1/files": {
            "post": {"summary": "Upload a file (multipart/form-data: file, purpose, expires_after)",
                     "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
                         "type": "object", "required": ["file", "purpose"], "properties": {
                             "file": {"type": "string", "format": "binary"},
                             "purpose": {"type": "string", "enum": list(PURPOSES)},
                             "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                             "expires_after[seconds]": {"type": "integer", "minimum": EXPIRES_MIN_S,
                                                        "maximum": EXPIRES_MAX_S}}}}}},
                     "responses": answers("File", error_responses(400, 401, 413))},
            "get": {"summary": "This key's files",
                    "parameters": [{"name": n, "in": "query", "schema": {"type": "string"}}
                                   for n in ("purpose", "after", "limit", "order")],
                    "responses": answers("FileList", error_responses(400, 401))}},
        "/v1/files/{file_id}": {
            "get": {"summary": "A file's object", "parameters": [_FILE_ID],
                    "responses": answers("File", error_responses(401, 404))},
            "delete": {"summary": "Delete a file", "parameters": [_FILE_ID],
                       "responses": {"200": {"description": "deleted"}, **error_responses(401, 404)}}},
        "/v1/files/{file_id}/content": {
            "get": {"summary": "The bytes as uploaded", "parameters": [_FILE_ID],
                    "responses": {"200": {"description": "the file",
                                          "content": {"application/octet-stream": {"schema": {"type": "string"}}}},
                                  **error_responses(401, 404)}}},
    },
    schemas={"File": _FILE_OBJECT,
             "FileList": {"type": "object", "properties": {"object": {"type": "string"},
                                                           "data": {"type": "array", "items": _FILE_OBJECT},
                                                           "has_more": {"type": "boolean"}}}},
)
