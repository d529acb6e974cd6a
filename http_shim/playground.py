"""The browser playground: a chat page and its assets, served by the shim itself.

GET /playground is the page, GET /playground/<file> its assets (hand-written, in the playground/
folder: no CDN, no build step), and GET / redirects to the page. They need no API key (the page asks
for one when /v1/models answers 401). Model output reaches the DOM only as text (markdown.js builds
elements, never HTML); the Content-Security-Policy is the second line of defence.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, redirect, send_from_directory, url_for
from werkzeug.exceptions import NotFound

ASSETS = Path(__file__).resolve().parent / "playground"
# The files served and their types (a fixed list: nothing else in the folder is reachable);
# werkzeug adds "; charset=utf-8" to text (and SVG) types.
CONTENT_TYPES = {
    "playground.css": "text/css",
    "playground.js": "text/javascript",
    "markdown.js": "text/javascript",
    "api.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

playground = Blueprint("playground", __name__)


def _send(name: str, content_type: str) -> Response:
    # Revalidated on every load (ETag, 304): a new shim version's files are never served stale.
    response = send_from_directory(ASSETS, name, mimetype=content_type, max_age=0)
    response.headers.update(SECURITY_HEADERS)
    return response


@playground.get("/")
@playground.get("/playground/")
def to_page() -> Response:
    return redirect(url_for(".page"))


@playground.get("/playground")
def page() -> Response:
    return _send("index.html", "text/html")


@playground.get("/playground/<name>")
def asset(name: str) -> Response:
    if name not in CONTENT_TYPES:
        raise NotFound()
    return _send(name, CONTENT_TYPES[name])
