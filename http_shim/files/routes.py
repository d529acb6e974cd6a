"""/v1/files: upload, list, retrieve, content, delete, each within the caller's tenant (auth.tenant)."""

from __future__ import annotations

from flask import Flask, Response, request

from ..auth import tenant
from ..errors import APIError
from ..protocol.base import parse
from ..protocol.listing import page, query_values
from ..web import json_response
from .protocol import FileListQuery, FileUpload
from .store import FileRecord, FileStore
from .upload import receive_upload

FILES_ROUTE = "/v1/files"


def file_not_found(file_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No such File object: {file_id}", "invalid_request_error", param, None)


def register_files(app: Flask, files: FileStore) -> None:
    def owned(file_id: str) -> FileRecord:
        record = files.get(tenant(), file_id)
        if record is None:
            raise file_not_found(file_id, "file_id")
        return record

    @app.post(FILES_ROUTE)
    def upload_file() -> Response:
        received = receive_upload(files)
        try:
            if received.upload is None:
                raise APIError(400, "You must provide a 'file' part.", "invalid_request_error", "file", None)
            form = dict(received.fields, filename=received.filename)
            expires = {k: form.pop(f"expires_after[{k}]") for k in ("anchor", "seconds")
                       if f"expires_after[{k}]" in form}
            if expires:
                form["expires_after"] = query_values(expires, ("seconds",))
            fields = parse(FileUpload, form)
            record = received.upload.commit(tenant(), fields.filename, fields.purpose,
                                            fields.expires_after and fields.expires_after.seconds)
        finally:
            if received.upload is not None:
                received.upload.abort()  # nothing, once committed
        return json_response(record.as_object())

    @app.get(FILES_ROUTE)
    def list_files() -> Response:
        query = parse(FileListQuery, query_values(request.args))
        records, more = files.list(tenant(), query.purpose, query.after, query.limit, query.order)
        return json_response(page([r.as_object() for r in records], more))

    @app.get(f"{FILES_ROUTE}/<file_id>")
    def retrieve_file(file_id: str) -> Response:
        return json_response(owned(file_id).as_object())

    @app.get(f"{FILES_ROUTE}/<file_id>/content")
    def file_content(file_id: str) -> Response:
        record = owned(file_id)
        content = files.content(record.owner, file_id)
        if content is None:  # deleted meanwhile
            raise file_not_found(file_id, "file_id")
        return Response(content, 200, mimetype="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{_header_safe(record.filename)}"'})

    @app.delete(f"{FILES_ROUTE}/<file_id>")
    def delete_file(file_id: str) -> Response:
        if not files.delete(tenant(), file_id):
            raise file_not_found(file_id, "file_id")
        return json_response({"id": file_id, "object": "file", "deleted": True})


def _header_safe(name: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' and ord(c) < 128 else "_" for c in name)
