"""Fuzzing the real stack (default model) from the shim's OpenAPI document, as tests/test_shim_fuzz.py
does against the fake engine: random constraints, tools, logit biases, prompts and token ids reach
the real engine, and no answer may be a 5xx. The shim caps max_tokens and n so each request stays
short on a CPU. A few requests per operation in `make test`; `make fuzz` raises the number
(env CONDUIT_FUZZ_EXAMPLES) and adds the coverage phase (env CONDUIT_FUZZ_PHASES)."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, settings

from launcher.stack import Stack
from common import ANSWER, MODEL, QUESTION
from fake_engine import start_shim, stop_process
from http_shim.limits import RequestLimits
from http_shim.openapi_document import openapi_document
from test_shim_fuzz import MAX_EXAMPLES, PHASES, check_answer, load_schema

# schemathesis's pytest plugin, which turns a schema's `parametrize()` into tests: loaded here, for
# these modules, rather than by every pytest process (pyproject.toml's `-p no:schemathesis`; ~0.45 s each).
pytest_plugins = ["schemathesis.pytest.plugin"]
pytestmark = pytest.mark.model

LIMITS = RequestLimits(max_tokens=8, max_n=2)
SHIM_ARGS = ["--max-tokens-limit", str(LIMITS.max_tokens), "--max-n", str(LIMITS.max_n), "--request-timeout", "120"]
EXAMPLES = int(os.environ.get("CONDUIT_STACK_FUZZ_EXAMPLES", str(max(1, MAX_EXAMPLES // 2))))


@pytest.fixture(scope="module")
def fuzzed_shim(stack: Stack) -> Iterator[str]:
    """The URL of a shim with small limits in front of the session's engine."""
    process, shim_url = start_shim(stack.engine_address, *SHIM_ARGS)
    try:
        yield shim_url
        # Both processes survived, and the stack still answers.
        assert process.poll() is None, "the fuzzed shim died"
        stack.check_alive()
        request = urllib.request.Request(
            f"{shim_url}/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 8}).encode(),
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert ANSWER.startswith(json.load(response)["choices"][0]["message"]["content"])
    finally:
        stop_process(process)


def test_the_fuzzed_document_is_the_served_one(fuzzed_shim: str) -> None:
    with urllib.request.urlopen(f"{fuzzed_shim}/openapi.json", timeout=30) as response:
        assert json.load(response) == DOCUMENT


DOCUMENT = openapi_document(LIMITS, auth_required=False)
schema = load_schema(json.loads(json.dumps(DOCUMENT)), MODEL, PHASES)


@schema.parametrize()
# No shrinking: against the real engine it takes minutes; the failing request is printed whole.
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[p for p in Phase if p is not Phase.shrink])
def test_no_request_gets_a_server_error(case, fuzzed_shim: str) -> None:
    check_answer(case, case.call(base_url=fuzzed_shim, timeout=180))
