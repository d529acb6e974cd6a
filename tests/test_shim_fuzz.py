"""Fuzzing the shim from its own OpenAPI document (GET /openapi.json) with schemathesis: a real shim
process in front of the fake engine (tests/fake_engine.py), requests built from the schema (valid
and invalid ones), and no answer may be a 5xx; every error is OpenAI-shaped, and the shim still
serves afterwards.

A few random requests per operation here, so the fast tier stays fast; `make fuzz` adds
schemathesis's coverage phase (boundary and invalid values of every field, about a thousand
requests; env CONDUIT_FUZZ_PHASES), raises the number of random ones (env CONDUIT_FUZZ_EXAMPLES)
and fuzzes the real stack too (tests/test_stack_fuzz.py).
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from fake_engine import MODEL_ID, FakeEngineServer, start_shim, stop_process
from http_shim.limits import DEFAULT_LIMITS
from http_shim.openapi_document import openapi_document

# schemathesis's pytest plugin, which turns a schema's `parametrize()` into tests: loaded here, for
# these modules, rather than by every pytest process (pyproject.toml's `-p no:schemathesis`; ~0.45 s each).
pytest_plugins = ["schemathesis.pytest.plugin"]
pytestmark = pytest.mark.slow  # a fuzzer: `make test` and `make fuzz`, not the fast tier

MAX_EXAMPLES = int(os.environ.get("CONDUIT_FUZZ_EXAMPLES", "10"))
API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def fuzzable(document: dict[str, Any], model: str) -> dict[str, Any]:
    """The shim's document, with `model` pinned to the served one so requests reach the engine
    (random names would all stop at a 404). Used on the real stack too."""
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponseRequest", "MessagesRequest",
                 "CountTokensRequest"):
        schemas[name]["properties"]["model"] = {"type": "string", "enum": [model]}
    return document


def load_schema(document: dict[str, Any], model: str, phases: list[str]) -> schemathesis.BaseSchema:
    """`phases`: schemathesis's "examples", "coverage" (boundary and invalid values of every field,
    about a thousand requests here) and "fuzzing" (random requests, `MAX_EXAMPLES` per operation)."""
    schema = schemathesis.openapi.from_dict(fuzzable(document, model))
    schema.config.phases.update(phases=phases)
    schema.config.max_stream_events = 100_000  # read streams to their end (schemathesis stops at 20 events)
    return schema


def check_answer(case: schemathesis.Case, response: Any) -> None:
    """No 5xx; errors in OpenAI's shape (Anthropic's on /v1/messages); streams end with [DONE] (or
message_stop) or an error event."""
    try:
        _check_answer(case, response)
    except AssertionError:
        print(f"failing request: {case.method} {case.path} headers={case.headers} query={case.query} "
              f"body={json.dumps(case.body, default=repr)}")  # default: schemathesis's NOT_SET for no body
        raise


def _check_answer(case: schemathesis.Case, response: Any) -> None:
    assert response.status_code < 500, f"{response.status_code} for {case.method} {case.path}: {response.text[:500]}"
    if response.status_code >= 400 and case.path.startswith("/v1/messages"):  # Anthropic's shape
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    elif response.status_code >= 400 and case.path not in ("/health",):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
    content_type = (response.headers.get("content-type") or [""])[0]  # schemathesis: header -> values
    if content_type.startswith("text/event-stream") and case.path.startswith("/v1/responses"):
        check_responses_events(response.text, response.stream_cut_short)
    elif content_type.startswith("text/event-stream"):
        events = [line for line in response.text.split("\n") if line.startswith("data: ")]
        assert not any('"error"' in event for event in events[:-1])
        if not response.stream_cut_short:  # not left by the client
            assert events and (events[-1] in ("data: [DONE]", 'data: {"type":"message_stop"}')
                               or '"error"' in events[-1]), response.text[-500:]


def check_responses_events(text: str, cut_short: bool) -> None:
    """A Responses stream: only the flat error event has a truthy "error"; one terminal event, last."""
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
    assert all(not e.get("error") for e in events if e["type"] != "error"), text[-500:]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    if not cut_short and events and events[0]["type"] == "response.created":  # a replay of nothing is empty
        assert events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed"), text[-500:]


@pytest.fixture(scope="module")
def shim_url():
    fake = FakeEngineServer().start()
    # The request timeout bounds any request a fuzzer would make hang (none should).
    process, url = start_shim(fake.address, "--api-key", API_KEY, "--request-timeout", "30")
    yield url
    # Still serving after everything the fuzzer sent.
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["choices"][0]["message"]["content"] == "Hello from choice 0."
    assert process.poll() is None
    stop_process(process)
    fake.stop()


def test_the_fuzzed_document_is_the_served_one(shim_url):
    with urllib.request.urlopen(f"{shim_url}/openapi.json", timeout=30) as response:
        assert json.load(response) == DOCUMENT


# Built in-process (schemathesis's pytest plugin loads schemas at collection time, before any shim
# runs; its lazy loader does not work with this pytest), and checked above against the served one.
DOCUMENT = openapi_document(DEFAULT_LIMITS, auth_required=True)
PHASES = os.environ.get("CONDUIT_FUZZ_PHASES", "examples,fuzzing").split(",")
schema = load_schema(json.loads(json.dumps(DOCUMENT)), MODEL_ID, PHASES)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case, shim_url):
    check_answer(case, case.call(base_url=shim_url, headers=AUTH, timeout=60))
