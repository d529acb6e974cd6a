"""/v1/batches: create, retrieve, cancel, list, each within the caller's tenant (auth.tenant), as
the Files API scopes the input and output files."""

from __future__ import annotations

from flask import Flask, Response, request

from ..auth import tenant
from ..errors import APIError, invalid
from ..files import FileStore, file_not_found
from ..protocol.base import parse
from ..protocol.listing import page, query_values
from ..web import json_response, read_body
from .protocol import BATCHES_ROUTE, BatchCreate, BatchListQuery
from .runner import BatchRunner
from .store import BatchStore, new_batch, public


def batch_not_found(batch_id: str) -> APIError:
    return APIError(404, f"No batch found with id '{batch_id}'.", "invalid_request_error", "batch_id", None)


def register_batch_routes(app: Flask, store: BatchStore, files: FileStore, runner: BatchRunner) -> None:
    def owned(batch_id: str) -> dict:
        batch = store.get(tenant(), batch_id)
        if batch is None:
            raise batch_not_found(batch_id)
        return batch

    @app.post(BATCHES_ROUTE)
    def create_batch() -> Response:
        body = parse(BatchCreate, read_body())
        record = files.get(tenant(), body.input_file_id)
        if record is None:
            raise file_not_found(body.input_file_id, "input_file_id")
        if record.purpose != "batch":
            raise invalid(f"The input file must have been uploaded with purpose 'batch'; {record.id} has purpose "
                          f"'{record.purpose}'.", "input_file_id")
        expires = body.output_expires_after and body.output_expires_after.seconds
        batch = new_batch(record.id, body.endpoint, body.metadata, expires)
        store.create(tenant(), batch, runner.id)
        runner.submit(batch["id"])
        return json_response(public(batch))

    @app.get(BATCHES_ROUTE)
    def list_batches() -> Response:
        query = parse(BatchListQuery, query_values(request.args))
        batches, more = store.list(tenant(), query.after, query.limit)
        return json_response(page([public(b) for b in batches], more))

    @app.get(f"{BATCHES_ROUTE}/<batch_id>")
    def retrieve_batch(batch_id: str) -> Response:
        return json_response(public(owned(batch_id)))

    @app.post(f"{BATCHES_ROUTE}/<batch_id>/cancel")
    def cancel_batch(batch_id: str) -> Response:
        batch = owned(batch_id)
        if batch["status"] not in ("validating", "in_progress", "cancelling", "cancelled"):
            raise invalid(f"Cannot cancel batch '{batch_id}': it is already {batch['status']}.", None,
                          "invalid_batch_status")
        return json_response(public(runner.cancel(batch)))
