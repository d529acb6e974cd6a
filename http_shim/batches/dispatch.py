"""One batch request run through the shim's own route for its endpoint, in a request context of its
own: the same parsing, validation, engine calls and answer as a live request to that URL, only the
engine calls go at batch priority (web.BATCH_LINE_KEY) and the caller is the batch's owner. Every
failure comes back as the route's error answer (the app's error handlers), never as an exception."""

from __future__ import annotations

import json
from typing import Any

from flask import Flask, g

from ..auth import set_tenant_digest
from ..observe import REQUEST_ID_KEY, ROUTE_KEY
from ..web import BATCH_LINE_KEY


def run_request(app: Flask, endpoint: str, body: dict[str, Any], owner: str, request_id: str
                ) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of POST `endpoint` with `body`, as the batch's owner."""
    environ = {REQUEST_ID_KEY: request_id, BATCH_LINE_KEY: True, ROUTE_KEY: endpoint}
    with app.test_request_context(endpoint, method="POST", data=json.dumps(body, ensure_ascii=False).encode(),
                                  content_type="application/json", environ_overrides=environ):
        set_tenant_digest(owner)
        try:
            answer = app.dispatch_request()
        except Exception as error:  # noqa: BLE001 - the app's handlers turn it into the route's error answer
            answer = app.handle_user_exception(error)
        response = app.make_response(answer)
        try:
            return response.status_code, json.loads(response.get_data())
        except ValueError:  # no JSON (no route answers so; kept safe)
            return response.status_code, {"error": {"message": "The request gave no JSON answer.",
                                                    "type": "server_error", "param": None, "code": None}}
        finally:
            g.pop("body", None)
