"""Runs batches: validation, their requests (a few at a time, at batch priority), and their end.

One greenlet per active batch walks its requests without an outcome in file order; each request
takes a place in a pool shared by all batches (`max_in_flight`), so batches add at most that many
calls to the engine's queue and never crowd live requests out of it, while the engine, which admits
batch work only into room live traffic leaves, stays busy. Each outcome is committed as it comes
(store.py): a shim that stops mid-batch takes the batch up again at its next start, and the requests
already answered are not run again.

A request the engine could not take (429: its queue is full; 503: it is away or restarting) is tried
again a few times, with backoff, before its error goes into the error file. Cancel stops new requests
at once; those in flight finish, then the batch ends `cancelled` with what it has. A batch past its
`expires_at` ends `expired`: its requests not run go into the error file as `batch_expired`.
While the shim drains, no new request starts (the drain waits for those in flight), and the batch
is left as it is for the next start.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import gevent
from gevent.pool import Pool
from flask import Flask

from ..drain import Drain
from ..files import FileStore, TooLarge
from ..ids import new_id
from ..metrics import ShimMetrics
from .claims import RunnerClaims
from .dispatch import run_request
from .lines import line_error, read_lines
from .store import BatchStore, Outcome

log = logging.getLogger("http_shim.batches")

DEFAULT_MAX_IN_FLIGHT = 32  # requests of all batches in the engines at once: the engine's default batch size
RETRIED_STATUSES = (429, 503)  # the engine's queue was full, or it was away: worth another try
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0)  # ~24 s in all: an engine restart fits
OUTPUT_PURPOSE = "batch_output"


def _usage(body: dict[str, Any]) -> tuple[int, int, int, int]:
    """(input, cached, output, reasoning) tokens of an answer, whichever endpoint's usage it carries."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0, 0, 0
    inputs = usage.get("prompt_tokens", usage.get("input_tokens")) or 0
    outputs = usage.get("completion_tokens", usage.get("output_tokens")) or 0
    in_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    out_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    return inputs, in_details.get("cached_tokens") or 0, outputs, out_details.get("reasoning_tokens") or 0


class BatchRunner:
    def __init__(self, app: Flask, store: BatchStore, files: FileStore, drain: Drain, metrics: ShimMetrics,
                 claims: RunnerClaims, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.app, self.store, self.files, self.drain, self.metrics = app, store, files, drain, metrics
        self.claims = claims
        self._slots = Pool(max_in_flight)
        self._running: dict[str, gevent.Greenlet] = {}

    @property
    def id(self) -> str:
        """What a batch records as its runner (claims.py)."""
        return self.claims.id

    def start(self) -> None:
        """Takes up the batches a stopped shim left unfinished (not those another live shim runs)."""
        for batch_id in self.store.active():
            if self._take(batch_id):
                log.info("batch %s: taken up again", batch_id)
        self._publish()

    def _take(self, batch_id: str) -> bool:
        """Runs the batch here if it is this runner's or its runner is gone."""
        runner = self.store.runner(batch_id)
        if runner != self.id and (self.claims.alive(runner) or not self.store.claim(batch_id, self.id, runner)):
            return False
        self.submit(batch_id)
        return True

    def submit(self, batch_id: str) -> None:
        if batch_id not in self._running:
            self._running[batch_id] = gevent.spawn(self._run, batch_id)
        self._publish()

    def cancel(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Marks an unfinished batch `cancelling`: its runner (here or in another shim on this store)
        starts no new request and ends it `cancelled`."""
        if batch["status"] in ("validating", "in_progress"):
            batch.update(status="cancelling", cancelling_at=int(time.time()))
            self.store.save(batch)
            self._take(batch["id"])
        return batch

    # ---------------------------------------------------------------- a batch

    def _run(self, batch_id: str) -> None:
        try:
            if self._batch(batch_id)["status"] == "validating":
                self._validate(self._batch(batch_id))
            if self._batch(batch_id)["status"] == "in_progress":
                self._run_requests(self._batch(batch_id))
            if self.drain.draining:
                return  # left as it is: the next start takes it up
            if self._batch(batch_id)["status"] in ("in_progress", "finalizing", "cancelling"):
                self._finish(self._batch(batch_id))
        except Exception:  # noqa: BLE001 - a bug must not leave the batch running forever
            log.exception("batch %s failed", batch_id)
            batch = self._batch(batch_id)
            batch.update(status="failed", failed_at=int(time.time()), errors={"object": "list", "data": [
                line_error("internal_error", "The batch failed on the server; its log has the details.")]})
            self.store.save(batch)
        finally:
            self._running.pop(batch_id, None)
            self._publish()

    def _batch(self, batch_id: str) -> dict[str, Any]:
        batch = self.store.get(None, batch_id)
        assert batch is not None, batch_id  # batches are never deleted
        return batch

    def _validate(self, batch: dict[str, Any]) -> None:
        """Reads the input file whole: its requests stored and the batch `in_progress`, or `failed` with
        `errors` naming the lines at fault (lines.py)."""
        content = self.files.content(self.store.owner(batch["id"]), batch["input_file_id"])
        if content is None:  # deleted since the batch was created
            lines, errors = [], [line_error("file_not_found", f"The input file {batch['input_file_id']} is gone.",
                                            param="input_file_id")]
        else:
            lines, errors = read_lines(content, batch["endpoint"])
        now = int(time.time())
        if errors:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
            log.info("batch %s failed validation: %d errors", batch["id"], len(errors))
        else:
            self.store.add_requests(batch["id"], lines)
            model = lines[0].body.get("model")
            batch.update(status="in_progress", in_progress_at=now, model=model if isinstance(model, str) else None,
                         request_counts={"total": len(lines), "completed": 0, "failed": 0})
            log.info("batch %s: %d requests to %s", batch["id"], len(lines), batch["endpoint"])
        if self._batch(batch["id"])["status"] == "validating":  # not cancelled meanwhile
            self.store.save(batch)

    def _stopping(self, batch: dict[str, Any]) -> bool:
        return (self.drain.draining or time.time() >= batch["expires_at"]
                or self.store.status(batch["id"]) == "cancelling")

    def _run_requests(self, batch: dict[str, Any]) -> None:
        pending = self.store.pending(batch["id"])
        waiting = self.metrics.batch_requests_waiting
        waiting.inc(len(pending))
        started: list[gevent.Greenlet] = []
        try:
            for index, custom_id, body in pending:
                self._slots.wait_available()
                if self._stopping(batch):
                    break
                waiting.dec()
                started.append(self._slots.spawn(self._request, batch, index, custom_id, body))
        finally:
            waiting.dec(len(pending) - len(started))
            gevent.joinall(started)

    def _request(self, batch: dict[str, Any], index: int, custom_id: str, body: dict[str, Any]) -> None:
        """One request through its endpoint's route; its outcome committed. The drain waits for it to the
        commit (its engine calls alone would end before), so a stop loses no answer."""
        request_id = new_id("batch_req")
        self.metrics.batch_requests_running.inc()
        tracked = _Tracked()
        self.drain.add(tracked)
        try:
            owner = self.store.owner(batch["id"])
            for delay in (*RETRY_DELAYS_S, None):
                status, answer = run_request(self.app, batch["endpoint"], body, owner, request_id)
                if status not in RETRIED_STATUSES or delay is None or self._stopping(batch):
                    break
                gevent.sleep(delay)
            if status == 503 and self.drain.draining:
                return  # cut by the shim's stop, not answered: run at the next start
            line = {"id": request_id, "custom_id": custom_id,
                    "response": {"status_code": status, "request_id": request_id, "body": answer}, "error": None}
            ok = 200 <= status < 300
            self.store.record(batch["id"], index, Outcome(line, ok, _usage(answer)))
            self.metrics.batch_requests.labels("completed" if ok else "failed").inc()
        finally:
            self.drain.discard(tracked)
            self.metrics.batch_requests_running.dec()

    def _finish(self, batch: dict[str, Any]) -> None:
        """The output and error files written; the batch `completed`, `expired` or `cancelled`."""
        now = int(time.time())
        if batch["status"] == "cancelling":
            final = "cancelled"
        else:
            pending = self.store.pending(batch["id"])
            final = "expired" if pending and now >= batch["expires_at"] else "completed"
            code, message = ("batch_expired", "This request could not be executed before the completion window "
                             "expired.") if final == "expired" else ("internal_error", "This request was not run.")
            for index, custom_id, _ in pending:
                line = {"id": new_id("batch_req"), "custom_id": custom_id, "response": None,
                        "error": {"code": code, "message": message}}
                self.store.record(batch["id"], index, Outcome(line, False))
                self.metrics.batch_requests.labels("expired" if final == "expired" else "failed").inc()
            if final == "completed":
                batch.update(status="finalizing", finalizing_at=now)
                self.store.save(batch)
        outcomes = self.store.outcomes(batch["id"])
        owner = self.store.owner(batch["id"])
        try:
            batch["output_file_id"] = self._write(owner, f"{batch['id']}_output.jsonl",
                                                  [line for ok, line in outcomes if ok], batch)
            batch["error_file_id"] = self._write(owner, f"{batch['id']}_error.jsonl",
                                                 [line for ok, line in outcomes if not ok], batch)
        except TooLarge as error:
            final = "failed"
            batch["errors"] = {"object": "list", "data": [line_error("output_too_large", str(error))]}
        batch["request_counts"], batch["usage"] = self.store.tally(batch["id"])
        batch.update(status=final, **{f"{final}_at": int(time.time())})
        self.store.save(batch)
        self.store.drop_requests(batch["id"])
        log.info("batch %s %s: %s", batch["id"], final, batch["request_counts"])

    def _write(self, owner: str, filename: str, lines: list[dict[str, Any]], batch: dict[str, Any]) -> str | None:
        """A file of JSONL lines (none: no file), the owner's, purpose `batch_output`."""
        if not lines:
            return None
        upload = self.files.begin_upload()
        try:
            upload.write(b"".join(_json_line(line) for line in lines))
            return upload.commit(owner, filename, OUTPUT_PURPOSE, batch.get("output_expires_after_s")).id
        finally:
            upload.abort()  # nothing, once committed

    def _publish(self) -> None:
        counts = self.store.counts_by_status()
        for status in ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                       "cancelled"):
            self.metrics.batches.labels(status).set(counts.get(status, 0))


class _Tracked:
    """A batch request as the drain counts it; a cut reaches its engine calls, tracked apart."""

    def interrupt(self, error: Any) -> None:
        pass


def _json_line(line: dict[str, Any]) -> bytes:
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"
