"""Overload through the shim: 10x what the engine can hold (a batch of one and two waiting places)
sent at once, streamed and not. Every request gets its answer or a 429 with Retry-After in
OpenAI's error shape; none gets a 5xx, none hangs, and the engine serves normally afterwards.
`make soak` does the same at scale for minutes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from launcher.stack import Stack
from common import ANSWER, MODEL, QUESTION, chat_request

pytestmark = pytest.mark.model

CAPACITY = 3  # single_slot_stack: one running, two waiting
IN_FLIGHT = 10 * CAPACITY


def one_request(base_url: str, stream: bool) -> tuple[int, dict[str, str], str]:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "stream": stream}
    with httpx.Client(base_url=base_url, timeout=120) as client:
        if not stream:
            response = client.post("/chat/completions", json=body)
            return response.status_code, dict(response.headers), response.text
        with client.stream("POST", "/chat/completions", json=body) as response:
            return response.status_code, dict(response.headers), response.read().decode()


def test_ten_times_the_capacity_gets_answers_or_429_never_5xx(single_slot_stack: Stack) -> None:
    base_url = single_slot_stack.base_url
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        results = list(pool.map(lambda i: one_request(base_url, stream=i % 2 == 1), range(IN_FLIGHT)))
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0, "10x the engine's capacity should overflow its queue"
    assert statuses.count(200) >= CAPACITY, statuses
    for status, headers, body in results:
        if status == 429:
            assert headers.get("retry-after", "").isdigit(), headers
            error = json.loads(body)["error"]
            assert error["type"] == "rate_limit_error" and error["message"]
        elif headers.get("content-type", "").startswith("text/event-stream"):
            assert body.rstrip().endswith("data: [DONE]"), body[-200:]
            assert '"error"' not in body
        else:
            assert json.loads(body)["choices"][0]["message"]["content"]
    # The engine is not left wedged: a normal request gets the usual answer.
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response = client.post("/chat/completions", json=chat_request())
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == ANSWER
