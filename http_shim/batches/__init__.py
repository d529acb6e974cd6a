"""OpenAI's Batch API (/v1/batches): JSONL files of requests (uploaded to /v1/files with purpose
`batch`) run through the shim's own routes at a priority below interactive traffic, their answers
collected into output and error files (docs/batches.md). protocol.py types the requests, lines.py
checks an input file, store.py keeps batches and their requests' outcomes (SQLite), dispatch.py runs
one request through its route, runner.py runs the batches (claims.py: each in one shim only),
routes.py serves them per tenant."""

from __future__ import annotations

from flask import Flask

from ..drain import Drain
from ..files import FileStore
from ..metrics import ShimMetrics
from .protocol import BATCHES_API, BATCHES_ROUTE
from .routes import register_batch_routes
from .claims import RunnerClaims
from .runner import DEFAULT_MAX_IN_FLIGHT, BatchRunner
from .store import BatchStore

__all__ = ["BATCHES_API", "BATCHES_ROUTE", "DEFAULT_MAX_IN_FLIGHT", "open_batches"]


def open_batches(app: Flask, store_dir: str, files: FileStore, drain: Drain, metrics: ShimMetrics,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> BatchRunner:
    """The routes, and the runner (started: it takes up the batches a stop left unfinished)."""
    store = BatchStore(store_dir)
    runner = BatchRunner(app, store, files, drain, metrics, RunnerClaims(store_dir), max_in_flight)
    register_batch_routes(app, store, files, runner)
    runner.start()
    return runner
