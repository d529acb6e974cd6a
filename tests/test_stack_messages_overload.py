"""The Messages API with the real engine's queue full: the anthropic SDK raises its RateLimitError
(429 with Retry-After). The engine runs one sequence with two waiting (conftest's
single_slot_stack, shared with test_stack_disconnect.py); three endless chat streams fill it (test_stack_disconnect.py checks that the engine serves again
once they are closed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from launcher.stack import Stack
from common import MODEL, QUESTION, STORY, lazy_module

anthropic = lazy_module("anthropic")
from test_stack_disconnect import endless_params

pytestmark = pytest.mark.model


def test_full_queue_is_a_rate_limit_error(single_slot_stack: Stack) -> None:
    params = endless_params(single_slot_stack, STORY)
    with openai.OpenAI(base_url=single_slot_stack.base_url, api_key="unused", max_retries=0, timeout=60) as chat, \
            anthropic.Anthropic(base_url=single_slot_stack.shim_url, api_key="unused", max_retries=0,
                                timeout=60) as claude:
        # One running, two waiting: the queue is full once all three have their 200 (a waiting
        # stream's comes after a heartbeat interval without its first answer). Opened together.
        with ThreadPoolExecutor(3) as pool:
            streams = list(pool.map(lambda _: chat.chat.completions.create(model=MODEL, messages=STORY, stream=True,
                                                                           **params), range(3)))
        try:
            with pytest.raises(anthropic.RateLimitError) as caught:
                claude.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
            assert caught.value.status_code == 429 and int(caught.value.response.headers["retry-after"]) >= 0
            assert caught.value.body["error"]["type"] == "rate_limit_error"
        finally:
            for stream in streams:
                stream.close()
