"""A batch's input file read and checked whole (the `validating` step), as OpenAI does: each line a
JSON object {custom_id, method: "POST", url: the batch's endpoint, body: an object}, custom_ids unique,
no `stream: true`, at most MAX_LINES lines (and, for /v1/embeddings, MAX_EMBEDDING_INPUTS inputs in all).
Any problem fails the whole batch before a line runs, with
`errors` naming each line at fault (1-based; up to MAX_REPORTED of them). A body that is an object is
not checked here: the endpoint's own validation answers it when the line runs (a 400 in the error file,
exactly as the live endpoint answers it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LINES = 50_000  # OpenAI's cap on requests per batch
MAX_REPORTED = 100  # errors listed in a failed batch's `errors`
MAX_EMBEDDING_INPUTS = 50_000  # OpenAI's cap on embedding inputs across a /v1/embeddings batch's requests
EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True)
class BatchLine:
    index: int  # the request's place among the file's requests (0-based)
    line: int  # its line in the file (1-based)
    custom_id: str
    body: dict[str, Any]


def line_error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    """One entry of a batch's `errors.data` (the openai SDK's BatchError)."""
    return {"code": code, "message": message, "param": param, "line": line}


def read_lines(content: bytes, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The file's requests, or the errors that fail the batch (then the lines are not to be run)."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue  # blank lines (a final newline) are no requests
        problem, parsed = _check(raw, number, endpoint, seen)
        if problem is not None:
            errors.append(problem)
        else:
            lines.append(BatchLine(len(lines), number, parsed["custom_id"], parsed["body"]))
    if not lines and not errors:
        errors.append(line_error("empty_file", "The input file has no requests: it must be JSONL, one request "
                                               "per line."))
    if len(lines) + len(errors) > MAX_LINES:
        errors.insert(0, line_error("too_many_requests", f"The input file has {len(lines) + len(errors)} requests; "
                                                         f"a batch may hold at most {MAX_LINES}."))
    inputs = sum(embedding_inputs(line.body.get("input")) for line in lines) if endpoint == EMBEDDINGS else 0
    if inputs > MAX_EMBEDDING_INPUTS:
        errors.insert(0, line_error("too_many_embedding_inputs", f"The input file's requests hold {inputs} embedding "
                                    f"inputs; a batch may hold at most {MAX_EMBEDDING_INPUTS} across its requests."))
    return lines, errors[:MAX_REPORTED]


def embedding_inputs(value: Any) -> int:
    """How many inputs an embeddings body's `input` holds: a text or one list of token ids is one, a list of
    texts (or of token-id lists) one each. (A malformed one is the endpoint's to refuse when its line runs.)"""
    if isinstance(value, list) and value and not all(isinstance(item, int) for item in value):
        return len(value)
    return 1


def _check(raw: bytes, number: int, endpoint: str, seen: set[str]) -> tuple[dict[str, Any] | None, Any]:
    try:
        parsed = json.loads(raw)
        json.dumps(parsed, ensure_ascii=False).encode()  # lone surrogates, as the live endpoints refuse them
    except (ValueError, RecursionError, UnicodeEncodeError):
        return line_error("invalid_json_line", "This line is not parseable as valid JSON.", number), None
    if not isinstance(parsed, dict):
        return line_error("invalid_request", "Each line must be a JSON object with custom_id, method, url and "
                                             "body.", number), None
    custom_id = parsed.get("custom_id")
    if custom_id is None:
        return line_error("missing_required_parameter", "Missing required parameter: 'custom_id'.", number,
                          "custom_id"), None
    if not isinstance(custom_id, str) or not custom_id:
        return line_error("invalid_type", "'custom_id' must be a non-empty string.", number, "custom_id"), None
    if custom_id in seen:
        return line_error("duplicate_custom_id", "The custom_id for this request is a duplicate of another request. "
                                                 "The custom_id parameter must be unique for each request in a batch.",
                          number, "custom_id"), None
    seen.add(custom_id)
    if parsed.get("method") != "POST":
        return line_error("invalid_method", f"Only POST requests can be batched; got method "
                                            f"{json.dumps(parsed.get('method'))}.", number, "method"), None
    if parsed.get("url") != endpoint:
        return line_error("invalid_url", f"The request's url {json.dumps(parsed.get('url'))} does not match the "
                                         f"batch's endpoint {endpoint}.", number, "url"), None
    body = parsed.get("body")
    if not isinstance(body, dict):
        return line_error("invalid_request", "'body' must be a JSON object: the request's body.", number,
                          "body"), None
    if body.get("stream") not in (None, False):
        return line_error("invalid_request", "Streaming is not supported in batches: leave 'stream' out or set it "
                                             "to false.", number, "body.stream"), None
    return None, parsed
