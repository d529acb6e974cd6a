"""The playground page (http_shim/playground.py) in a real headless Chromium, driven by Playwright.

Against the shim in front of the scripted fake engine (fast): the page and its assets are served
open with their types and a strict CSP; a streamed answer arrives in several pieces; Markdown
renders while `<script>`, an `<img onerror>` and a javascript: link in an answer stay text; the
settings and the conversation reach the engine; Stop cancels the engine's call; 400, 429 and 503
show as readable messages and the page keeps working; a shim with API keys gets one asked for.
Against the real stack (default model): a streamed answer, Stop mid-answer with the engine's
metrics showing the request cancelled and nothing running; and docs/playground.md's screenshot.

A failed test leaves a screenshot of its page in tests/artifacts/<test name>.png.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import Stack
from common import MODEL
from fake_engine import MARKDOWN_ANSWER, REPO_ROOT, start_shim, stop_process

# Playwright only where a browser runs: this module's fast test (and test_shim_cors.py's) need no
# browser, and the offline wheelhouse leaves out its 50 MB wheel (docs/operations-offline.md).
if TYPE_CHECKING:
    from playwright.sync_api import Browser, LocatorAssertions, Page


def expect(actual) -> LocatorAssertions:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(actual)

ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
SCREENSHOT = REPO_ROOT / "docs" / "playground.png"
# Set to refresh docs/playground.png from the real-stack run (otherwise it goes to tests/artifacts/).
UPDATE_SCREENSHOT_ENV = "CONDUIT_UPDATE_SCREENSHOT"
VIEWPORT = {"width": 1100, "height": 750}
API_KEY = "playground-test-key"
TIMEOUT_MS = 15_000


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh page (own storage); script errors fail the test; a failure leaves a screenshot."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    failed_before = request.session.testsfailed
    yield opened
    # The call phase is reported before fixtures are torn down, so a failed call already counts.
    if request.session.testsfailed > failed_before:
        ARTIFACTS.mkdir(exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.name)  # parameters carry spaces and colons
        opened.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    context.close()
    assert not errors, f"script errors on the page: {errors}"


@pytest.fixture(scope="module")
def shim(fake) -> Iterator[str]:
    process, url = start_shim(fake.address, "--heartbeat-interval", "0.3")
    yield url
    stop_process(process)


@pytest.fixture(scope="module")
def keyed_shim(fake) -> Iterator[str]:
    process, url = start_shim(fake.address, "--api-key", API_KEY)
    yield url
    stop_process(process)


# ---------------------------------------------------------------------------------- helpers

def open_playground(page: Page, url: str) -> None:
    page.goto(f"{url}/")
    expect(page.locator("#model option")).not_to_have_count(0)


def watch_answers(page: Page) -> None:
    """Records the last answer's text each time the page changes it (in window.answerTexts)."""
    page.evaluate("""() => {
        window.answerTexts = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll(".turn.assistant .content");
            if (answers.length) window.answerTexts.push(answers[answers.length - 1].textContent);
        }).observe(document.getElementById("conversation"), {childList: true, subtree: true, characterData: true});
    }""")


def distinct_pieces(page: Page) -> list[str]:
    texts = page.evaluate("window.answerTexts")
    return [t for k, t in enumerate(texts) if t and (k == 0 or t != texts[k - 1])]


def ask(page: Page, question: str) -> None:
    page.fill("#prompt", question)
    page.press("#prompt", "Enter")


def last_answer(page: Page):
    return page.locator(".turn.assistant").last


def wait_answered(page: Page, timeout_ms: float = TIMEOUT_MS) -> str:
    """Waits for the last answer's stats line (the answer ended); returns it."""
    stats = last_answer(page).locator(".stats")
    stats.wait_for(timeout=timeout_ms)
    return stats.inner_text()


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A GET that does not follow redirects; status, lower-cased headers and body."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


# ---------------------------------------------------------------------------------- served files

def test_page_and_assets_are_served_open_with_types_and_csp(keyed_shim: str) -> None:
    status, headers, _ = http_get(f"{keyed_shim}/")
    assert status == 302 and headers["location"].endswith("/playground")
    status, headers, body = http_get(f"{keyed_shim}/playground")  # open although the API needs a key
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert b'src="playground/playground.js"' in body and b"<script>" not in body  # no inline script
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert "no-cache" in headers["cache-control"] and headers["etag"]
    status, _, _ = http_get(f"{keyed_shim}/playground", {"If-None-Match": headers["etag"]})
    assert status == 304  # revalidated, not downloaded again
    for name, content_type in [("playground.js", "text/javascript; charset=utf-8"),
                               ("markdown.js", "text/javascript; charset=utf-8"),
                               ("api.js", "text/javascript; charset=utf-8"),
                               ("playground.css", "text/css; charset=utf-8"),
                               ("favicon.svg", "image/svg+xml; charset=utf-8")]:
        status, headers, _ = http_get(f"{keyed_shim}/playground/{name}")
        assert (status, headers["content-type"]) == (200, content_type), name
        assert "script-src 'self'" in headers["content-security-policy"]
    for path in ("/playground/index.py", "/playground/..%2Fplayground.py", "/playground/%2E%2E/app.py"):
        assert http_get(f"{keyed_shim}{path}")[0] == 404, path
    assert http_get(f"{keyed_shim}/v1/models")[0] == 401  # the API itself stays closed


# ---------------------------------------------------------------------------------- fake engine

def test_streamed_answer_arrives_in_pieces_with_stats(page: Page, shim: str) -> None:
    open_playground(page, shim)
    expect(page.locator("#model")).to_have_value("fake-model")
    watch_answers(page)
    ask(page, "long:40")
    stats = wait_answered(page)
    expected = "".join(f" t{k}" for k in range(40)).strip()
    assert last_answer(page).locator(".content").inner_text() == expected
    pieces = distinct_pieces(page)
    assert len(pieces) > 1 and pieces[-1].strip() == expected, pieces
    assert "TTFT" in stats and "tok/s" in stats and "1 prompt + 40 completion = 41 tokens" in stats and "finish: stop" in stats


def test_markdown_renders_and_script_in_an_answer_is_text(page: Page, shim: str) -> None:
    open_playground(page, shim)
    ask(page, "markdown")
    wait_answered(page)
    answer = last_answer(page).locator(".content")
    expect(answer.locator("h2")).to_have_text("A bold answer")
    expect(answer.locator("h2 strong")).to_have_text("bold")
    expect(answer.locator("em")).to_have_text("italic")
    expect(answer.locator("li")).to_have_text(["first item", "second item"])
    expect(answer.locator("a")).to_have_count(1)  # the javascript: link stays text
    expect(answer.locator("a")).to_have_attribute("href", "https://example.com/docs")
    expect(answer.locator("pre code")).to_have_text("<script>window.injected = 'code block'</script>")
    expect(answer.locator("p code")).to_have_text("inline <b>code</b>")
    text = answer.inner_text()
    assert "<script>window.injected = 'answer'</script>" in text
    assert "<img src=x onerror=\"window.injected = 'img'\">" in text
    assert "[bad link](javascript:window.injected='link')" in text
    assert answer.locator("script, img, b, [onerror]").count() == 0
    assert page.evaluate("window.injected") is None
    assert MARKDOWN_ANSWER.count("\n") > 5  # the answer is the fake's Markdown, in more than one block


def test_settings_and_conversation_reach_the_engine(page: Page, shim: str, fake) -> None:
    open_playground(page, shim)
    page.fill("#system", "You are terse.")
    page.fill("#temperature", "0.3")
    page.fill("#top-p", "0.9")
    page.fill("#max-tokens", "3")
    page.fill("#seed", "42")
    page.check("#json-mode")
    ask(page, "first question")
    assert "finish: length" in wait_answered(page)
    expect(last_answer(page).locator(".content")).to_have_text("Hello from choice")
    ask(page, "second question")
    wait_answered(page)

    request = fake.engine.requests[-1]
    messages = [(m.role, m.content) for m in request.chat.messages]
    assert messages == [("system", "You are terse."), ("user", "first question"),
                        ("assistant", "Hello from choice"), ("user", "second question")]
    assert request.sampling.temperature == pytest.approx(0.3)
    assert request.sampling.top_p == pytest.approx(0.9)
    assert request.sampling.seed == 42
    assert request.stopping.max_tokens == 3
    assert request.constraint.WhichOneof("kind") == "json_object"

    page.click("#new-chat")  # a new conversation starts empty
    expect(page.locator(".turn")).to_have_count(0)
    page.fill("#system", "")
    ask(page, "third question")
    wait_answered(page)
    assert [m.content for m in fake.engine.requests[-1].chat.messages] == ["third question"]


def test_stop_aborts_the_stream_and_the_engine_call(page: Page, shim: str, fake) -> None:
    open_playground(page, shim)
    watch_answers(page)
    ask(page, "long:500")  # 10 s of tokens
    expect(last_answer(page).locator(".content")).to_contain_text("t3")
    streamed = fake.engine.requests[-1]
    assert streamed.chat.messages[-1].content == "long:500"
    page.click("#stop")
    assert "stopped" in wait_answered(page)
    assert fake.engine.wait_cancelled(streamed.request_id, TIMEOUT_MS / 1000), "the engine's call was not cancelled"
    stopped_text = last_answer(page).locator(".content").inner_text()
    assert "t499" not in stopped_text
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    ask(page, "after stop")  # the stopped answer stays in the conversation
    wait_answered(page)
    assert [m.role for m in fake.engine.requests[-1].chat.messages] == ["user", "assistant", "user"]


@pytest.mark.parametrize(("question", "max_tokens", "shown"), [
    ("error:INVALID_ARGUMENT:the engine refuses this", "16", "Bad request (400): the engine refuses this"),
    ("hello", "-1", "Bad request (400)"),  # refused by the shim itself, naming the field
    ("error:RESOURCE_EXHAUSTED:the queue is full", "16", "Too many requests (429): the queue is full"),
    ("error:UNAVAILABLE:the engine is draining", "16", "Service unavailable (503): The engine is unavailable: the engine is draining"),
    ("midstream-error", "16", "The answer was cut by an error: The engine failed"),  # an error event in a 200
])
def test_api_errors_show_as_readable_messages(page: Page, shim: str, question: str, max_tokens: str,
                                              shown: str) -> None:
    open_playground(page, shim)
    page.fill("#max-tokens", max_tokens)
    ask(page, question)
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text(shown)
    if max_tokens == "-1":
        expect(error).to_contain_text("[parameter: max_tokens]")
    if "(429)" in shown or "(503)" in shown:
        expect(error).to_contain_text("Try again in")
    # Not frozen: the question is back in the input, nothing half-done stays, and the next one works.
    expect(page.locator("#prompt")).to_have_value(question)
    expect(page.locator(".turn")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    page.fill("#max-tokens", "16")
    ask(page, "hello")
    assert "finish: stop" in wait_answered(page)
    expect(error).to_be_hidden()


def test_api_key_is_asked_for_and_kept_in_the_browser(page: Page, keyed_shim: str) -> None:
    page.goto(f"{keyed_shim}/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()  # /v1/models answered 401
    page.fill("#key", "wrong-key")
    page.click("#save-key")
    expect(page.locator("#key-error")).to_contain_text("refused")
    page.fill("#key", API_KEY)
    page.click("#save-key")
    expect(dialog).to_be_hidden()
    expect(page.locator("#model")).to_have_value("fake-model")
    assert page.evaluate("sessionStorage.getItem('conduit-api-key')") == API_KEY
    assert page.evaluate("localStorage.getItem('conduit-api-key')") is None
    ask(page, "hello")
    assert "finish: stop" in wait_answered(page)
    page.reload()  # the same tab keeps the key
    expect(page.locator("#model")).to_have_value("fake-model")
    expect(dialog).to_be_hidden()


# ---------------------------------------------------------------------------------- real stack

def engine_metric(stack: Stack, name: str, **labels: str) -> float:
    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.model
def test_real_model_streams_and_stop_leaves_the_engine_idle(page: Page, stack: Stack) -> None:
    open_playground(page, stack.shim_url)
    expect(page.locator("#model")).to_have_value(MODEL)
    page.fill("#max-tokens", "1000")
    page.fill("#seed", "7")
    cancelled = engine_metric(stack, "conduit:request_success_total", finished_reason="cancelled")
    watch_answers(page)
    ask(page, "Tell me a very long story about a lighthouse keeper.")
    page.wait_for_function("() => window.answerTexts.filter(Boolean).length >= 3", timeout=60_000)
    assert engine_metric(stack, "conduit:num_requests_running") == 1
    page.click("#stop")
    assert "stopped" in wait_answered(page)
    assert len(distinct_pieces(page)) > 1

    # The engine stops within a step and its metrics follow at once; they can only be polled, and a
    # loaded machine may take a while to get there, so the deadline is generous (met, it ends early).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        idle = engine_metric(stack, "conduit:num_requests_running") == 0
        moved = engine_metric(stack, "conduit:request_success_total", finished_reason="cancelled")
        if idle and moved == cancelled + 1:
            break
        time.sleep(0.1)
    assert engine_metric(stack, "conduit:num_requests_running") == 0, "the engine is still generating"
    assert moved == cancelled + 1, "the engine did not see the request cancelled"
    assert engine_metric(stack, "conduit:num_requests_waiting") == 0
    stack.check_alive()


@pytest.mark.model
def test_real_model_answer_screenshot(page: Page, stack: Stack) -> None:
    """A finished Markdown answer with its stats: docs/playground.md's screenshot."""
    open_playground(page, stack.shim_url)
    page.fill("#system", "You are a helpful coding assistant.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "160")
    page.fill("#seed", "7")
    ask(page, "Write a Python function that reverses a string.")
    stats = wait_answered(page, 120_000)  # 160 tokens on a loaded 2-core machine: event-driven, so generous
    assert "completion" in stats and "tok/s" in stats
    answer = last_answer(page).locator(".content")
    expect(answer.locator("pre code")).not_to_have_count(0)  # the model's code block, rendered
    path = SCREENSHOT if os.environ.get(UPDATE_SCREENSHOT_ENV) else ARTIFACTS / "playground.png"
    path.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(path))
