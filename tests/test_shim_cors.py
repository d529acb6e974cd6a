"""CORS on the shim (http_shim/cors.py, `--cors-allow-origin`), as a real process in front of the fake engine.

Over HTTP (httpx): a preflight from an allowed origin is a 204 with the allowed methods, headers
(the SDKs' X-Stainless-* family included) and max age, answered without an API key; a preflight
or request from another origin gets no Access-Control-* header; answers to an allowed origin (a
chat completion, a stream, a 401) carry Allow-Origin, Expose-Headers, Allow-Credentials and
Vary: Origin; `*` allows any origin without credentials; a shim without the flag sends no CORS
headers; the flag is repeatable and reads CONDUIT_CORS_ALLOW_ORIGIN; an origin with a path is a
usage error. In headless Chromium (as tests/test_playground_browser.py): a page on another origin
streams an answer through fetch() when its origin is allowed, and its fetch fails otherwise.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import pytest

from fake_engine import MODEL_ID, start_shim, stop_process
from http_shim import options
from http_shim.cors import normal_origin
from test_playground_browser import TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.sync_api import Browser  # imported where a browser runs (test_playground_browser.py)

ORIGIN = "http://allowed.test:1234"
OTHER_ORIGIN = "http://other.test:1234"
KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = "Hello from choice 0."  # the fake engine's default answer

# The page on another origin: streams a chat completion from the shim named in its query string.
PAGE = """<!doctype html><meta charset="utf-8"><title>CORS test</title><script>
(async () => {
  const shim = new URLSearchParams(location.search).get("shim");
  const outcome = {text: "", done: false, error: null};
  try {
    const response = await fetch(`${shim}/v1/chat/completions`, {
      method: "POST",
      headers: {"Authorization": "Bearer %(key)s", "Content-Type": "application/json"},
      body: JSON.stringify({model: "%(model)s", messages: [{role: "user", content: "hi"}], stream: true}),
    });
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (let read = await reader.read(); !read.done; read = await reader.read()) {
      buffer += decoder.decode(read.value, {stream: true});
    }
    for (const line of buffer.split("\\n")) {
      if (line === "data: [DONE]") outcome.done = true;
      else if (line.startsWith("data: ")) outcome.text += JSON.parse(line.slice(6)).choices[0]?.delta?.content ?? "";
    }
  } catch (error) {
    outcome.error = `${error.name}: ${error.message}`;
  }
  window.outcome = outcome;
})();
</script>""" % {"key": KEY, "model": MODEL_ID}


# ---------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """A static server for PAGE on another loopback port: an origin of its own."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def running_shim(fake, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    process, url = start_shim(fake.address, *args, env=env)
    yield url
    stop_process(process)


@pytest.fixture(scope="module")
def shim(fake, page_origin) -> Iterator[str]:
    """Allows ORIGIN and the test page's origin (the flag twice), and wants an API key."""
    yield from running_shim(fake, "--cors-allow-origin", ORIGIN, "--cors-allow-origin", page_origin,
                            "--api-key", KEY)


@pytest.fixture(scope="module")
def any_origin_shim(fake) -> Iterator[str]:
    yield from running_shim(fake, "--cors-allow-origin", "*")


@pytest.fixture(scope="module")
def plain_shim(fake) -> Iterator[str]:
    yield from running_shim(fake)


@pytest.fixture(scope="module")
def env_shim(fake) -> Iterator[str]:
    """Allows ORIGIN and OTHER_ORIGIN from the environment only."""
    yield from running_shim(fake, "--api-key", KEY,
                            env={"CONDUIT_CORS_ALLOW_ORIGIN": f"{ORIGIN}, {OTHER_ORIGIN}"})


# ---------------------------------------------------------------------------------- helpers

def preflight(url: str, origin: str, headers: str = "authorization, content-type") -> httpx.Response:
    return httpx.options(f"{url}/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": headers})


def chat(url: str, origin: str | None, headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=CHAT,
                      headers={**headers, **({"Origin": origin} if origin else {})}, timeout=30)


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name.startswith("access-control-")}


def names(value: str) -> set[str]:
    return {name.strip().lower() for name in value.split(",")}


def assert_allowed(response: httpx.Response, origin: str = ORIGIN) -> None:
    """What every answer to a listed origin carries."""
    assert response.headers["access-control-allow-origin"] == origin
    assert names(response.headers["access-control-expose-headers"]) >= {"x-request-id", "retry-after"}
    assert response.headers["access-control-allow-credentials"] == "true"
    assert "origin" in names(response.headers["vary"])


# ---------------------------------------------------------------------------------- over HTTP

def test_preflight_from_an_allowed_origin_is_answered_without_a_key(shim):
    requested = "authorization, content-type, x-request-id, x-stainless-lang, x-stainless-new-thing, x-other"
    response = preflight(shim, ORIGIN, requested)
    assert response.status_code == 204 and not response.content
    assert_allowed(response)
    assert names(response.headers["access-control-allow-methods"]) >= {"get", "post", "delete", "options"}
    allowed = names(response.headers["access-control-allow-headers"])
    assert allowed >= {"authorization", "content-type", "x-request-id", "openai-organization", "openai-beta",
                       "x-api-key", "anthropic-version", "x-stainless-lang", "x-stainless-retry-count"}
    assert "x-stainless-new-thing" in allowed and "x-other" not in allowed  # only the SDKs' family is added
    assert response.headers["access-control-max-age"] == "600"


def test_other_origins_get_no_cors_headers(shim):
    assert not cors_headers(preflight(shim, OTHER_ORIGIN))
    response = chat(shim, OTHER_ORIGIN)
    assert response.status_code == 200 and not cors_headers(response)
    assert not cors_headers(chat(shim, None))  # not from a browser page


def test_answers_to_an_allowed_origin_carry_cors_headers(shim):
    response = chat(shim, ORIGIN)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == ANSWER
    assert_allowed(response)


def test_a_401_carries_cors_headers_so_the_page_can_read_it(shim):
    response = chat(shim, ORIGIN, headers={})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert_allowed(response)


def test_a_stream_carries_cors_headers(shim):
    with httpx.stream("POST", f"{shim}/v1/chat/completions", json={**CHAT, "stream": True},
                      headers={**AUTH, "Origin": ORIGIN}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert_allowed(response)
        assert "data: [DONE]" in response.read().decode()


def test_without_the_flag_there_are_no_cors_headers(plain_shim):
    assert not cors_headers(preflight(plain_shim, ORIGIN))
    response = chat(plain_shim, ORIGIN)
    assert response.status_code == 200 and not cors_headers(response)


def test_any_origin_is_allowed_without_credentials(any_origin_shim):
    for response in (preflight(any_origin_shim, OTHER_ORIGIN), chat(any_origin_shim, OTHER_ORIGIN)):
        assert response.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in response.headers
    assert preflight(any_origin_shim, OTHER_ORIGIN).status_code == 204


def test_origins_from_the_environment(env_shim):
    for origin in (ORIGIN, OTHER_ORIGIN):
        assert_allowed(preflight(env_shim, origin), origin)
        assert_allowed(chat(env_shim, origin), origin)
    assert not cors_headers(chat(env_shim, "http://third.test"))


@pytest.mark.parametrize("origin", ["http://x.test/path", "allowed.test"])
def test_an_origin_that_is_not_one_is_a_usage_error(origin, capsys):
    with pytest.raises(SystemExit) as exited:  # the shim's own parsing, in this process
        options.parse_args(["--engine", "127.0.0.1:1", "--port", "0", "--cors-allow-origin", origin])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2 and "--cors-allow-origin" in stderr and origin in stderr


# ---------------------------------------------------------------------------------- in a browser

def stream_from_page(browser: Browser, page_origin: str, shim_url: str) -> dict:
    """Opens PAGE on its own origin; returns what its fetch() of a stream from `shim_url` got."""
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(f"{page_origin}/?shim={shim_url}")
        page.wait_for_function("window.outcome !== undefined")
        return page.evaluate("window.outcome")
    finally:
        context.close()


def test_a_page_on_an_allowed_origin_streams_an_answer(browser, page_origin, shim):
    assert stream_from_page(browser, page_origin, shim) == {"text": ANSWER, "done": True, "error": None}


@pytest.mark.parametrize("refusing", ["env_shim", "plain_shim"])
def test_a_page_on_another_origin_cannot_call_the_api(browser, page_origin, refusing, request):
    outcome = stream_from_page(browser, page_origin, request.getfixturevalue(refusing))
    assert outcome == {"text": "", "done": False, "error": "TypeError: Failed to fetch"}


def test_origins_are_compared_as_browsers_write_them() -> None:
    assert normal_origin("HTTP://Allowed.TEST:1234") == ORIGIN
    assert normal_origin("https://a.test:443") == "https://a.test"
    assert normal_origin("http://a.test:8080") == "http://a.test:8080"
    assert normal_origin("*") == "*"
